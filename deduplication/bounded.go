package deduplication

import (
	"errors"
	"time"

	"github.com/sluicemq/sluice/internal/bounded"
)

// ErrStoreTimeout is matched by the error of a store call (Begin, Claim,
// Commit, Rollback) that did not return within its bound: a store that does
// not answer, as a black-holed database does. It comes wrapped in a
// *sluice.DependencyError, so brake.MatchUnreachable counts it.
var ErrStoreTimeout = errors.New("deduplication: the store did not answer in time")

// abandonedMax is how many store calls that outlived their bound a stage
// lets go on in the background (each on a goroutine and, on SQL, a
// connection) before it stops starting new ones: past it every call fails at
// once with ErrStoreTimeout, until some of them return.
const abandonedMax = 64

// abandonGrace is how long a call whose context has ended may take to return
// by itself (a driver that honours its context does at once) before it is
// given up.
const abandonGrace = 100 * time.Millisecond

// newCalls returns the bounds of one stage's store calls (internal/bounded).
func newCalls() *bounded.Calls {
	return &bounded.Calls{Max: abandonedMax, Grace: abandonGrace, Timeout: ErrStoreTimeout}
}
