// Package poison is the stage that isolates a message that must not be
// retried — a Poison, Invariant or Exhausted failure — in a poison queue,
// with a diagnosis in its metadata (sluice_poison_class, sluice_poison_reason,
// ...: Diagnosis, and the tables of docs/poison.md), and acks the original
// only after the copy is stored. If the poison queue cannot be
// reached, the original is nacked: a message is never dropped silently.
//
// On RabbitMQ, give it the rabbitmq.Publisher: it waits for the publisher
// confirm and treats a basic.return (the poison queue does not exist) as a
// failure, which a confirm alone would hide.
package poison
