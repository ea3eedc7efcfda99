// Package rabbitmq is Sluice's RabbitMQ broker: what watermill-amqp v3 lacks
// and the stages need, kept in one package that imports the broker contract
// (package broker) and no stage, so that every stage stays broker-agnostic.
//
//   - NewBroker: one consumer queue as router.Add takes it (a broker.Broker):
//     its topology declared, the confirmed publisher of the copies, and the
//     Consumer. Connection holds the options every config here embeds.
//   - Publisher: a message.Publisher with publisher confirms pipelined on one
//     channel, mandatory routing with each basic.return matched to its message
//     (RabbitMQ confirms an unroutable message, so a confirm alone proves
//     nothing), deadlines from the message context, and reconnection.
//   - Marshaler: reads deliveries whose headers are not strings (x-death,
//     x-delivery-count, other producers' integers, booleans, timestamps),
//     which watermill-amqp's DefaultMarshaler rejects, and exposes what
//     operators need as string metadata (sluice_amqp_exchange,
//     sluice_amqp_death_count, ...: the tables of docs/rabbitmq.md).
//   - Topology: one consumer queue Q, its retry tier queues (per-queue
//     x-message-ttl, dead-lettered back to Q only) and its poison queue,
//     classic or quorum, declared idempotently or printed as
//     rabbitmqctl set_policy lines.
//   - Consumer: the subscriber NewBroker uses — up to Prefetch deliveries in
//     flight in one consumer, acked by tag in any order; a draining close;
//     the brake's pause (broker.GatedSubscriber); a delivery whose headers
//     the AMQP client cannot parse isolated in the poison queue.
//   - WithMarshaler: a watermill-amqp Config of your own, reading with the
//     Marshaler through the frame filter (BrokerConfig.WatermillSubscriber
//     gives NewBroker watermill-amqp's subscriber instead of the Consumer).
package rabbitmq
