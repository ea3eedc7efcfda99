// Package rabbitmq is Sluice's RabbitMQ adapter: what watermill-amqp v3 lacks
// and the stages need, kept in one package so that every stage stays
// broker-agnostic (they only use message.Publisher).
//
//   - Publisher: a message.Publisher with publisher confirms pipelined on one
//     channel, mandatory routing with each basic.return matched to its message
//     (RabbitMQ confirms an unroutable message, so a confirm alone proves
//     nothing), deadlines from the message context, and reconnection.
//   - Marshaler: reads deliveries whose headers are not strings (x-death,
//     x-delivery-count, other producers' integers, booleans, timestamps),
//     which watermill-amqp's DefaultMarshaler rejects, and exposes what
//     operators need as string metadata (ExchangeKey, DeathCountKey, ...).
//   - Topology: one consumer queue Q, its retry tier queues (per-queue
//     x-message-ttl, dead-lettered back to Q only) and its poison queue,
//     classic or quorum, declared idempotently or printed as
//     rabbitmqctl set_policy lines.
//   - NewSubscriber: watermill-amqp's subscriber with the Marshaler, consuming
//     queues the Topology declared.
package rabbitmq
