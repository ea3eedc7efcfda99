package brake

import (
	"errors"
	"strings"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/sqlstate"
)

// MatchSQLState returns a Match that accepts errors whose SQLSTATE starts
// with one of prefixes ("08" connection exceptions, "57P01" admin shutdown).
func MatchSQLState(prefixes ...string) func(error) bool {
	return func(err error) bool {
		state, ok := sqlstate.Of(err)
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
// reached (sluice.Unreachable: refused, reset or closed connections, failed
// dials, network timeouts, the SQLSTATEs of an unreachable database) and any
// failure of a stage's own call to its dependency (sluice.ErrDependency:
// the inbox store's begin or claim failing, say on a dropped inbox table),
// which no message can get past. A timeout of the handler's own context is
// not one: a slow message is not an outage.
func MatchUnreachable(err error) bool {
	return errors.Is(err, sluice.ErrDependency) || sluice.Unreachable(err)
}
