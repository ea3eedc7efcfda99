package brake

import (
	"errors"

	"github.com/sluicemq/sluice"
)

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
