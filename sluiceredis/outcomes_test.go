package sluiceredis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"

	"github.com/sluicemq/sluice/replay/replaytest"
	"github.com/sluicemq/sluice/sluiceredis"
)

func newStore(t *testing.T, retention time.Duration) (*sluiceredis.Outcomes, string) {
	t.Helper()
	client, prefix := testenv.Redis(t)
	s, err := sluiceredis.NewOutcomes(client, sluiceredis.OutcomesConfig{Prefix: prefix, Retention: retention})
	require.NoError(t, err)
	return s, prefix
}

// The Redis store passes the ledger conformance suite.
func TestConformance(t *testing.T) {
	t.Parallel()
	replaytest.Run(t, func(t *testing.T) ledger.Ledger {
		s, _ := newStore(t, 0)
		return s
	})
}

// With Retention, a run's records expire, and Outcomes forgets the run.
func TestRetention(t *testing.T) {
	t.Parallel()
	client, prefix := testenv.Redis(t)
	s, err := sluiceredis.NewOutcomes(client, sluiceredis.OutcomesConfig{Prefix: prefix, Retention: time.Hour})
	require.NoError(t, err)
	require.NoError(t, s.Record(t.Context(), replay.Record{Run: "r1", Item: "a", Outcome: sluice.OutcomeProcessed, At: time.Now()}))
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

	_, err = sluiceredis.NewOutcomes(nil, sluiceredis.OutcomesConfig{})
	require.ErrorContains(t, err, "NewOutcomes: the client is required")
	_, err = sluiceredis.NewOutcomes(client, sluiceredis.OutcomesConfig{Retention: -time.Second})
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
