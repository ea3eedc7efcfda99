package brake

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/sluicemq/sluice"
)

// MatchSQLState returns a Match that accepts errors whose SQLSTATE starts
// with one of prefixes ("08" connection exceptions, "57P01" admin shutdown).
func MatchSQLState(prefixes ...string) func(error) bool {
	return func(err error) bool {
		state, ok := sluice.SQLState(err)
		if !ok {
			return false
		}
		for _, p := range prefixes {
			if strings.HasPrefix(state, p) {
				return true
			}
		}
		return false
	}
}

// MatchUnreachable accepts the errors of a dependency that cannot be
// reached: a refused, reset or aborted connection, one the peer closed
// mid-conversation (io.EOF, io.ErrUnexpectedEOF), a network timeout, a
// connection the database/sql pool found bad or closed, the SQLSTATEs of a
// connection exception (08), of insufficient resources (53: too many
// connections, disk full, out of memory) or a server shutting down or
// starting up (57P01-57P03), and any failure of a stage's own call to its
// dependency (sluice.ErrDependency: the inbox store's begin or claim failing,
// say on a dropped inbox table), which no message can get past. A timeout of
// the handler's own context is not one: a slow message is not an outage.
func MatchUnreachable(err error) bool {
	switch {
	case errors.Is(err, sluice.ErrDependency):
		return true
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
	return MatchSQLState("08", "53", "57P01", "57P02", "57P03")(err)
}
