package redisstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T, retention time.Duration) (*redisstore.Store, string) {
	t.Helper()
	client, prefix := testenv.Redis(t)
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix, Retention: retention})
	require.NoError(t, err)
	return s, prefix
}

func rec(run, item string, o sluice.Outcome) replay.Record {
	return replay.Record{Run: run, Item: item, EventID: item, Outcome: o, At: time.Now().UTC().Truncate(time.Millisecond)}
}

// The store keeps the SQL store's rules: the CLI's "replayed" only where
// nothing is yet; a consumer's outcome replaces it; "duplicate" never
// replaces "processed" or "rejected"; an empty event id keeps the one
// there; the operator's records replace any outcome, keeping event id and
// class; Outcomes orders by run and item.
func TestRules(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, 0)
	ctx := t.Context()
	require.NoError(t, s.Replayed(ctx, []replay.Record{rec("r1", "b", ""), rec("r1", "a", ""), rec("r1", "c", "")}))
	require.NoError(t, s.Record(ctx, rec("r1", "a", sluice.OutcomeProcessed)))
	require.NoError(t, s.Replayed(ctx, []replay.Record{rec("r1", "a", "")}), "a replayed record after the outcome")
	require.NoError(t, s.Record(ctx, rec("r1", "a", sluice.OutcomeDuplicate)), "a second delivery")
	poisoned := rec("r1", "b", sluice.OutcomePoisoned)
	poisoned.Class, poisoned.Reason = "poison", "unknown schema version 3"
	require.NoError(t, s.Record(ctx, poisoned))
	noID := rec("r1", "c", sluice.OutcomeRejected)
	noID.EventID = ""
	require.NoError(t, s.Record(ctx, noID))
	require.NoError(t, s.Record(ctx, rec("r1", "c", sluice.OutcomeDuplicate)))
	compensated := rec("r1", "b", replay.OutcomeCompensated)
	compensated.EventID, compensated.Class, compensated.Reason, compensated.Handler = "", "", "refunded by hand", "operator alice"
	require.NoError(t, s.Records(ctx, []replay.Record{compensated}))
	require.NoError(t, s.Record(ctx, rec("r0", "z", sluice.OutcomeProcessed)))

	got, err := s.Outcomes(ctx, "")
	require.NoError(t, err)
	var lines []string
	for _, r := range got {
		lines = append(lines, fmt.Sprintf("%s %s %s %s %s %q %s", r.Run, r.Item, r.EventID, r.Outcome, r.Class, r.Reason, r.Handler))
	}
	require.Equal(t, []string{
		`r0 z z processed  "" `,
		`r1 a a processed  "" `,
		`r1 b b compensated poison "refunded by hand" operator alice`,
		`r1 c c rejected  "" `,
	}, lines)
	one, err := s.Outcomes(ctx, "r0")
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, got[0].At, one[0].At.UTC(), "the time survives the round trip")
}

// Many consumers record one item at once — processed by one, duplicate by
// the others, in any order: it ends processed, every time.
func TestConcurrentRecordsOfOneItem(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, 0)
	for i := range 50 {
		run := fmt.Sprint("run", i)
		var wg sync.WaitGroup
		for j := range 8 {
			o := sluice.OutcomeDuplicate
			if j == 3 {
				o = sluice.OutcomeProcessed
			}
			wg.Go(func() { require.NoError(t, s.Record(t.Context(), rec(run, "e", o))) })
		}
		wg.Wait()
		got, err := s.Outcomes(t.Context(), run)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, sluice.OutcomeProcessed, got[0].Outcome, "run %d", i)
	}
}

// With Retention, a run's records expire, and Outcomes forgets the run.
func TestRetention(t *testing.T) {
	t.Parallel()
	client, prefix := testenv.Redis(t)
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix, Retention: time.Hour})
	require.NoError(t, err)
	require.NoError(t, s.Record(t.Context(), rec("r1", "a", sluice.OutcomeProcessed)))
	ttl, err := client.PTTL(t.Context(), prefix+"run:r1").Result()
	require.NoError(t, err)
	require.InDelta(t, time.Hour.Seconds(), ttl.Seconds(), 60)
	require.NoError(t, client.Del(t.Context(), prefix+"run:r1").Err()) // as if it expired
	got, err := s.Outcomes(t.Context(), "")
	require.NoError(t, err)
	require.Empty(t, got)
	runs, err := client.SMembers(t.Context(), prefix+"runs").Result()
	require.NoError(t, err)
	require.Empty(t, runs, "the expired run is forgotten")

	_, err = redisstore.New(redisstore.Config{})
	require.ErrorContains(t, err, "Client is required")
	_, err = redisstore.New(redisstore.Config{Client: client, Retention: -time.Second})
	require.ErrorContains(t, err, "Retention")
}

// The replay stage on the Redis store records what became of replayed
// messages: processed, and (with no poison stage inside it) failed with the
// reason. The CLI's tests run it with the whole stack.
func TestStageOnRedis(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, 0)
	mw, err := replay.New(replay.Config{Store: s})
	require.NoError(t, err)
	h := mw(func(m *message.Message) ([]*message.Message, error) {
		if string(m.Payload) == "bad" {
			return nil, sluice.Poison(errors.New("unknown schema version 3"))
		}
		return nil, nil
	})
	for _, p := range []string{"good", "bad"} {
		m := message.NewMessage(p, []byte(p))
		m.Metadata.Set(replay.RunKey, "run-1")
		m.Metadata.Set(replay.ItemKey, p)
		m.Metadata.Set(sluice.EventIDKey, p)
		_, _ = h(m)
	}
	got, err := s.Outcomes(t.Context(), "run-1")
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "bad", got[0].Item)
	require.Equal(t, sluice.OutcomeFailed, got[0].Outcome)
	require.Contains(t, got[0].Reason, "unknown schema version 3")
	require.Equal(t, sluice.OutcomeProcessed, got[1].Outcome)
}
