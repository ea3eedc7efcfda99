// Package sluicetest tests a service's handlers through the real stack, on
// a virtual clock: "this error retries through the 5-minute tier", "a
// malformed order is poisoned with these headers", "a duplicate delivery
// has no second effect", "the brake engages while the database is
// unreachable", "this handler's produced event is in the outbox".
//
// A Harness runs your handler as a service runs it (service.Handler: the
// stages router.Add assembles, in their one order, with the production
// defaults) on the embedded broker, whose retry tiers and whose brake
// cool-downs wait on a virtual clock (Harness.Clock): Advance and Settle run the default
// ladder (30s → 5m → 30m) in milliseconds. The inbox, outbox and replay
// tables are real — SQLite in the test's temporary directory by default,
// or your PostgreSQL (Config.DB). The package imports no network client.
//
// Every message a test publishes has a subject; the kit keeps a Trace per
// subject — one Step per delivery, its fate as the stages recorded it (the
// sluice.Report the Trace stage reads): processed, duplicate, rejected,
// retried to tier T, parked, poisoned with class C and its diagnosis
// headers, held by the brake, requeued by a shutdown — with what the
// handler produced (the outbox rows of a committed delivery). The Require
// methods check a trace and report a failure with the whole trace; a table
// test compares Trace.Outcomes.
//
// Faults: FailPublishes (a tier, the poison queue or the outbox relay
// refuses a publish: ErrNacked, ErrUnroutable), FailCommits (the inbox's
// COMMIT fails), CrashAfterCommit (the ack is lost: a redelivery),
// Redeliver (a duplicate delivery), Unreachable with Dependency (a
// dependency down for a while: the brake), Shutdown (mid-handler).
//
// Config.Broker runs the same harness on a real broker (Sluice's own tests
// run one scenario table on the kit and on RabbitMQ with PostgreSQL and
// compare the traces). docs/testing.md is the guide.
package sluicetest
