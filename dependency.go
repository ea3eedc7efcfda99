package sluice

import "errors"

// ErrDependency is matched (errors.Is) by every *DependencyError: a failure
// of a stage's own call to a dependency — the inbox store's begin or claim —
// rather than of the message or of the handler's own statements. The same
// message would fail the same way in every attempt while the dependency is
// down, so the brake's MatchUnreachable counts it.
var ErrDependency = errors.New("sluice: a dependency failed")

// DependencyError is a failure of a stage's own call to a dependency.
type DependencyError struct {
	// Op names the call: "inbox begin", "inbox claim".
	Op string
	// Err is what the dependency returned.
	Err error
}

// Error returns "<op>: <err>".
func (e *DependencyError) Error() string { return e.Op + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *DependencyError) Unwrap() error { return e.Err }

// Is reports whether target is ErrDependency.
func (e *DependencyError) Is(target error) bool { return target == ErrDependency }

// SQLState returns the SQLSTATE of the first error in err's chain that
// carries one (lib/pq's *pq.Error, pgx's *pgconn.PgError, or any error with
// a SQLState() string method, as a MySQL adapter can give), and whether
// there was one. The Classifier and the brake's matchers read it here.
func SQLState(err error) (string, bool) {
	s, ok := errors.AsType[sqlStater](err)
	if !ok {
		return "", false
	}
	return s.SQLState(), true
}
