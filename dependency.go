package sluice

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
)

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

// SQLState returns the SQLSTATE of err, and whether it has one. It reads,
// in this order:
//   - the first error in err's chain with a SQLState() string method
//     (lib/pq's *pq.Error, pgx's *pgconn.PgError, an adapter of your own);
//   - else the first of the chain's first 64 errors that is a struct, or a
//     pointer to one, with the exported fields Number uint16 and SQLState
//     [5]byte: go-sql-driver/mysql's *MySQLError, read by reflection so
//     that this package imports no driver. For the error numbers whose
//     SQLSTATE says too little — 1040 and 1203 (too many connections,
//     08004), 1205 (lock wait timeout, reported as HY000: 55P03, as
//     PostgreSQL's lock_timeout), 1213 (deadlock, 40001), 2006 and 2013
//     (server gone or lost, 08S01) — it returns the SQLSTATE given in parentheses;
//     for the others the one the server reported, none if it reported none.
//
// The Classifier and the brake's matchers read it here.
func SQLState(err error) (string, bool) {
	if s, ok := errors.AsType[sqlStater](err); ok {
		return s.SQLState(), true
	}
	return mysqlSQLState(err)
}

// Unreachable reports whether err is the error of a dependency that cannot
// be reached, whoever asks: a refused, reset or aborted connection, a host
// or network unreachable, a connection the peer closed mid-conversation
// (io.EOF, io.ErrUnexpectedEOF), a dial that failed or a network timeout, a
// connection the database/sql pool found bad or closed, or a SQLSTATE of
// UnreachableSQLState. The one list of them: the Classifier's defaults
// class them Transient and the brake's MatchUnreachable counts them.
func Unreachable(err error) bool {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	if op, ok := errors.AsType[*net.OpError](err); ok && (op.Op == "dial" || op.Timeout()) {
		return true
	}
	state, ok := SQLState(err)
	return ok && UnreachableSQLState(state)
}

// UnreachableSQLState reports the SQLSTATEs of a database that cannot serve
// anyone right now: a connection exception (class 08), insufficient
// resources (class 53: too many connections, disk full, out of memory), a
// server shutting down or starting up (57P01-57P03).
func UnreachableSQLState(state string) bool {
	switch state {
	case "57P01", "57P02", "57P03":
		return true
	}
	return strings.HasPrefix(state, "08") || strings.HasPrefix(state, "53")
}
