// Package router assembles Sluice's stages in their one order around a
// Watermill handler:
//
//	ShutdownGrace → Trace → Poison → Retry → Classify → Inbox → Recoverer → handler
//
// Middlewares builds the chosen stages (any may be left out) for wiring by
// hand; Add adds a reliable handler to an existing *message.Router in one
// call. RabbitMQ declares one consumer queue's topology and supplies the
// confirmed publisher, the subscriber and competing consumers; Embedded is
// the no-server default: an in-process broker (EmbeddedPubSub) that tracks
// every delivery until acked and names at Close what it did not finish,
// in-process tiers, and a poison topic that can be read back.
//
// Why this order: errors travel outward, so Classify sits inside the stages
// that act on a class; Poison sits outside Retry because a spent retry budget
// is a poison outcome; the inbox claim and the business writes share one
// transaction, so the handler runs inside the Inbox and the router acks only
// after its commit; the Recoverer sits inside the Inbox so that a panic rolls
// back; Trace is outermost of the stages that act, to see every outcome;
// ShutdownGrace wraps them all, so a handler in flight when the router closes
// gets time to commit before its context is cancelled.
package router
