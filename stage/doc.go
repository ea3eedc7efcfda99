// Package middleware holds the Sluice stages that need neither a broker nor
// a database: Classify (every error gets its sluice.Class), Recoverer (a
// panic becomes an Invariant failure with its stack), ShutdownGrace (a
// handler in flight may finish its commit while the router closes) and
// Trace (OpenTelemetry spans and metrics), and TracingPublisher.
//
// The failure vocabulary they act on — classes, wrappers, the Classifier,
// metadata keys, the outcome Report — is the root package sluice.
//
// The stages are ordered, outermost first:
//
//	ShutdownGrace → Trace → Replay → Order → Poison → Retry → Brake → Classify → Inbox → Recoverer → handler
//
// so that Classify sits inside the stages that act on a class, and a panic is
// an error before the inbox decides whether to commit. Package router
// assembles this order (router.Order); every stage also works alone.
package stage
