package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/sluicesql"
)

// watched is the outbox store, counting the batches taken after closed was
// set.
type watched struct {
	*sluicesql.Outbox
	closed, late atomic.Bool
}

func (w *watched) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	if w.closed.Load() {
		w.late.Store(true)
	}
	return w.Outbox.Due(ctx, limit, maxBytes)
}

// Issue 28.8: after Close returns, the relay takes nothing more — whether
// Close came before Run ("Close, then Run") or while Run was starting ("go
// Run, then Close"). Before, a batch was taken and published after Close
// returned, 300 of 300 tries.
func TestNothingIsTakenAfterCloseReturns(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage(watermill.NewUUID(), nil)))
	require.NoError(t, tx.Commit())
	// A publisher that refuses: the row stays for every try.
	pub := &unreachableFirst{pub: s.rabbit.Publisher()}
	pub.n.Store(1 << 40)
	for _, order := range []string{"Close, then Run", "go Run, then Close"} {
		late := 0
		for range 300 {
			w := &watched{Outbox: s.outbox}
			r, err := outbox.NewRelay(w, pub, outbox.RelayConfig{StatsInterval: -1, PollInterval: time.Hour})
			require.NoError(t, err)
			done := make(chan error, 1)
			if order == "Close, then Run" {
				require.NoError(t, r.Close())
				w.closed.Store(true)
				go func() { done <- r.Run(context.Background()) }()
			} else {
				go func() { done <- r.Run(context.Background()) }()
				require.NoError(t, r.Close())
				w.closed.Store(true)
			}
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return after Close")
			}
			if w.late.Load() {
				late++
			}
		}
		require.Zero(t, late, "%s: tries in which a batch was taken after Close returned", order)
	}
}
