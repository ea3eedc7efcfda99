// Package retrytiers is the stage that parks a transiently failed message in
// a delayed retry tier instead of requeueing it at the head of its queue.
//
// Tiers are delays like 30s → 5m → 30m. Attempt N of a delivery that fails
// with a Transient failure is copied to tier N (same payload and metadata,
// sluice.AttemptKey N+1, the last error, the first failure time) and the
// original is acked only after the copy's publish returned; after the last
// tier the failure becomes ClassExhausted, which the poison stage isolates.
// The attempt count lives in Sluice's own metadata, not in RabbitMQ's x-death
// (which RabbitMQ compresses per queue and reason).
//
// On RabbitMQ each tier is a queue with a per-queue TTL that dead-letters back
// to the consumer's queue (see package rabbitmq); one queue per tier, because
// RabbitMQ expires messages only at the head of a queue. The embedded
// default (package embedded) has the in-process equivalent: not durable.
package retrytiers
