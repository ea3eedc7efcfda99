package sluice

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/sluicemq/sluice/internal/sqlstate"
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

// Unreachable reports whether err is the error of a dependency that cannot
// be reached, whoever asks: a refused, reset or aborted connection, a host
// or network unreachable, a connection the peer closed mid-conversation
// (io.EOF, io.ErrUnexpectedEOF), a dial that failed or a network timeout, a
// connection the database/sql pool found bad or closed, or the SQLSTATE of a
// database that cannot serve anyone right now (class 08, connection
// exception; class 53, insufficient resources; 57P01-57P03, shutting down
// or starting up). The one list of them: the Classifier's defaults
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
	state, ok := sqlstate.Of(err)
	return ok && sqlstate.Unreachable(state)
}
