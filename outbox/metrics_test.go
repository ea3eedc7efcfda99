package outbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/sluicesql"
)

// failingFinish is the outbox whose first batch's delete fails, as one
// whose connection was terminated before its COMMIT: the rows come back.
type failingFinish struct {
	*sluicesql.Outbox
	failed atomic.Bool
}

func (f *failingFinish) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	b, err := f.Outbox.Due(ctx, limit, maxBytes)
	if err != nil || len(b.Rows()) == 0 || !f.failed.CompareAndSwap(false, true) {
		return b, err
	}
	return failOnce{b}, nil
}

type failOnce struct{ outbox.Batch }

func (b failOnce) Finish(ctx context.Context, _ []int64, _ []outbox.Failed) error {
	_ = b.Release(ctx)
	return errors.New("injected: the connection was terminated before the COMMIT")
}

// Issue 28.13: sluice.outbox.relayed counts the rows whose delete
// committed. Before, it counted them at the confirm: 20 rows whose delete
// failed, sent again, read 40.
func TestRelayedCountsRowsOnceTheirDeleteCommitted(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	const n = 20
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	for range n {
		require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage(watermill.NewUUID(), nil)))
	}
	require.NoError(t, tx.Commit())
	store := &failingFinish{Outbox: s.outbox}
	r, err := outbox.NewRelay(store, s.rabbit.Publisher(), outbox.RelayConfig{Env: sluice.Env{MeterProvider: s.mp}, PollInterval: 10 * time.Millisecond, RetryMin: 10 * time.Millisecond, StatsInterval: -1})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	require.Eventually(t, func() bool { return s.count("outbox") == 0 }, 2*time.Minute, 10*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.True(t, store.failed.Load())
	require.Equal(t, 2*n, testenv.QueueDepth(t, s.conn, s.produced), "sent twice")
	require.Equal(t, int64(n), testenv.CounterSum(t, s.meter, telemetry.MetricOutboxRelayed), "relayed once each")
}
