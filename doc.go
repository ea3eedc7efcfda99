// Package sluice is the vocabulary every Sluice stage shares: what a failed
// delivery means, and the metadata the stages read and write.
//
// A failed delivery has exactly one Class: Transient (retry within a budget),
// Rejected (an expected business outcome: commit and ack), Poison (the message
// is bad: isolate), Invariant (a contract is violated: isolate and alert) or
// Exhausted (retries spent: isolate). Handlers state the class explicitly, as
// River's river.JobCancel(err) does:
//
//	return sluice.Transient(err) // the stock service timed out: retry later
//	return sluice.Reject(err)    // out of stock: commit, ack, never retry
//	return sluice.Poison(err)    // unknown schema version: isolate at once
//	return sluice.Invariant(err) // the order must exist: isolate and alert
//
// The Classifier derives the class of any other error: explicit wrappers
// first, then user rules, then the default rules:
//
//   - Transient: context.DeadlineExceeded and context.Canceled; net.Error
//     timeouts; ECONNREFUSED, ECONNRESET, ECONNABORTED, EPIPE;
//     driver.ErrBadConn and sql.ErrConnDone; any error with a SQLState()
//     method reporting class 08 or 53, or 40001, 40P01, 55P03, 57P01-57P03.
//   - Poison: *json.SyntaxError and *json.UnmarshalTypeError; SQLSTATE class
//     23 (integrity-constraint violations fail the same way on every retry).
//   - Invariant: *PanicError.
//   - anything else: ClassifierConfig.Default (Transient).
//
// The metadata keys (EventIDKey, AttemptKey, ...) are the facts every stage
// shares, one key per fact; Attempt is their one parser of the attempt
// number. Report is what the stages record about a delivery for the Trace
// stage. KeyFunc is a message's key — the inbox's business event id, the
// ordering stage's entity — taken by KeyFromMetadata, KeyFromJSON,
// KeyFromJSONInteger, KeyPrefix and KeyJoin; a message without one gives a
// *KeyError (Poison). This package imports nothing else of the module: the stages
// (package middleware, deduplication, retrytiers, poison), the assembly
// (router) and the brokers (rabbitmq) build on it.
package sluice
