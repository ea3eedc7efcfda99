package sluiceredis

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// A Redis that does not have a script — restarted, its scripts flushed,
// another node of a cluster — answers a pipeline's runs of it by hash with
// NOSCRIPT: evalEach sends those runs its source. The script is new to the
// shared Redis (a name of its own in a comment), so its hash is unknown.
func TestEvalEachSendsTheSourceOfAScriptRedisDoesNotHave(t *testing.T) {
	t.Parallel()
	client, prefix := testenv.Redis(t)
	s := &Inbox{client: client}
	script := redis.NewScript(fmt.Sprintf("-- %s\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])", testenv.Name("evaleach")))
	keys := []string{prefix + "a", prefix + "b", prefix + "c"}
	got, err := s.evalEach(t.Context(), script, keys, 5)
	require.NoError(t, err)
	require.Equal(t, []int64{5, 5, 5}, got, "each key's run, sent as source")
	got, err = s.evalEach(t.Context(), script, keys, 2)
	require.NoError(t, err)
	require.Equal(t, []int64{7, 7, 7}, got, "and then by hash")
}

// The claim script answers "claimed" to the token that holds the key: go-redis
// sends a pipeline again after a read error or timeout, after Redis ran it.
// Before, the second run answered "held by another unit of work", and the
// key, held by no live unit of work, stayed pending for the whole Lease.
func TestTheClaimScriptAnswersItsOwnTokenClaimed(t *testing.T) {
	t.Parallel()
	client, prefix := testenv.Redis(t)
	key := prefix + "k"
	for range 2 {
		n, err := claimScript.Run(t.Context(), client, []string{key}, "pending:mine", 60000).Int()
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	n, err := claimScript.Run(t.Context(), client, []string{key}, "pending:other", 60000).Int()
	require.NoError(t, err)
	require.Equal(t, 2, n, "another token: held")
}
