// Package middleware holds Sluice's failure vocabulary and the stages that do
// not talk to a broker: the classifier and the recoverer.
//
// A failed delivery has exactly one Class: Transient (retry within a budget),
// Rejected (an expected business outcome: commit and ack), Poison (the message
// is bad: isolate), Invariant (a contract is violated: isolate and alert) or
// Exhausted (retries spent: isolate). Handlers state the class explicitly with
// Transient(err), Reject(err), Poison(err) or Invariant(err); the Classifier
// derives it for any other error, explicit wrappers first, then user rules,
// then the default rules:
//
//   - Transient: context.DeadlineExceeded and context.Canceled; net.Error
//     timeouts; ECONNREFUSED, ECONNRESET, ECONNABORTED, EPIPE;
//     driver.ErrBadConn and sql.ErrConnDone; any error with a SQLState()
//     method reporting class 08 or 53, or 40001, 40P01, 57P01, 57P02, 57P03.
//   - Poison: *json.SyntaxError and *json.UnmarshalTypeError.
//   - Invariant: *PanicError.
//   - anything else: ClassifierConfig.Default (Transient).
//
// The stages are ordered, outermost first:
//
//	tracing → poison → retrytiers → Classify → deduplication → Recoverer → handler
//
// so that Classify sits inside the stages that act on a class, and a panic is
// an error before the inbox decides whether to commit. Package router
// assembles this order; every stage also works alone.
package middleware
