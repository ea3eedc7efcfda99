// Package outbox is Sluice's transactional outbox: what a handler produces
// is written into the inbox's transaction — the same commit as the claim
// and the business rows — and a Relay publishes it after the commit, with
// confirms, so a produced message is never lost to a publish that failed
// after the commit, and never sent by a delivery that rolled back.
//
// Two ways to produce, one table:
//
//   - a PublishingHandler's returned messages: set router.HandlerConfig.Outbox
//     (router.Add wraps the handler with Handler);
//   - an explicit call inside any handler: a Writer's Publish(ctx, topic,
//     msgs...) on the delivery's context.
//
// A service that produces without consuming (an HTTP handler writing an
// order) writes in its own SQL transaction with sluicesql.Outbox's Write.
//
// Each message gets its message id (its UUID) and its event id
// (sluice.EventIDKey, the UUID when the producer set none) when it is
// written: a row the relay sends twice — it stopped between the broker's
// confirm and the row's delete — is a duplicate for the receiving inbox.
//
// The Relay takes batches of due rows (several relays at once, each row
// held by one), publishes each batch in order and pipelined (a
// broker.EachPublisher such as rabbitmq.Publisher reports each message's
// outcome), deletes what the broker confirmed and keeps what it did not
// with its error and a later attempt: never dropped, never in the way of
// the rest. It wakes on the inbox's commits in its process and polls
// otherwise; every store call and publish is bounded; Close finishes the
// batch in flight. See docs/outbox.md.
package outbox
