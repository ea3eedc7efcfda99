// Package router assembles Sluice's stages in their one order (Order)
// around a Watermill handler:
//
//	ShutdownGrace → Trace → Replay → Order → Poison → Retry → Brake → Classify → Inbox → Recoverer → handler
//
// Middlewares builds the chosen stages (any may be left out) for wiring by
// hand; Add adds a reliable handler to an existing *message.Router in one
// call, on any broker.Broker: rabbitmq.NewBroker declares one consumer
// queue's topology and supplies the confirmed publisher and the
// subscriber; embedded.New is the no-server default. Add refuses stages
// that cannot keep the promise together (ErrUnsafeStages).
//
// Why this order: errors travel outward, so Classify sits inside the stages
// that act on a class; Poison sits outside Retry because a spent retry budget
// is a poison outcome; Replay sits outside Poison to record the fate of a
// replayed message whatever it was; the Brake sits inside Retry so that what
// it holds back never reaches a tier; the inbox claim and the business writes share one
// transaction, so the handler runs inside the Inbox and the router acks only
// after its commit; the Recoverer sits inside the Inbox so that a panic rolls
// back; Trace is outermost of the stages that act, to see every outcome;
// ShutdownGrace wraps them all, so a handler in flight when the router closes
// gets time to commit before its context is cancelled.
package router
