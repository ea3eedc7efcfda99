package outbox_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/sluicesql"
)

// measured is the outbox, recording the largest batch it handed out, in
// bytes of payload.
type measured struct {
	*sluicesql.Outbox
	largest atomic.Int64
}

func (m *measured) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	b, err := m.Outbox.Due(ctx, limit, maxBytes)
	if err == nil {
		var n int64
		for _, r := range b.Rows() {
			n += int64(len(r.Message.Payload))
		}
		for old := m.largest.Load(); n > old && !m.largest.CompareAndSwap(old, n); old = m.largest.Load() {
		}
	}
	return b, err
}

// Issue 28.15: a batch is bounded by bytes as well as rows, so the relay's
// memory follows BatchBytes, not BatchSize times the largest message.
// Before, 300 rows of 1.5 MB were one batch (537 MB RSS). The rows here:
// SLUICE_OUTBOX_BIG_ROWS (default 40) of 1.5 MB.
func TestABatchIsBoundedByBytes(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	n := 40
	if v, err := strconv.Atoi(os.Getenv("SLUICE_OUTBOX_BIG_ROWS")); err == nil {
		n = v
	}
	payload := bytes.Repeat([]byte("x"), 1500*1000)
	for range n / 10 {
		tx, err := s.db.BeginTxx(t.Context(), nil)
		require.NoError(t, err)
		for range 10 {
			require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage(watermill.NewUUID(), payload)))
		}
		require.NoError(t, tx.Commit())
	}
	limit := int64(4 << 20)
	if v, err := strconv.ParseInt(os.Getenv("SLUICE_OUTBOX_BATCH_BYTES"), 10, 64); err == nil {
		limit = v // a measurement: 1<<40 is no bound, as before
	}
	store := &measured{Outbox: s.outbox}
	r, err := outbox.NewRelay(store, s.rabbit.Publisher(), outbox.RelayConfig{Env: sluice.Env{MeterProvider: s.mp}, BatchBytes: limit, PollInterval: 10 * time.Millisecond, StatsInterval: -1})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	require.NoError(t, testenv.AwaitCount(n/10*10, time.Minute, 10*time.Minute, func() int { return n/10*10 - s.count("outbox") }), "rows relayed")
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.LessOrEqual(t, store.largest.Load(), max(limit, 1500*1000), "no batch over BatchBytes")
	require.Equal(t, n/10*10, testenv.QueueDepth(t, s.conn, s.produced))
	testenv.Drain(t, s.conn, s.produced)
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "VmHWM") {
				t.Logf("%d rows of 1.5 MB, largest batch %d bytes; the test process's peak RSS %s", n, store.largest.Load(), strings.TrimSpace(l[6:]))
			}
		}
	}
}

// unwoken is the outbox store without its wake-ups: the relay learns of
// due rows by polling only.
type unwoken struct{ s *sluicesql.Outbox }

func (u unwoken) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	return u.s.Due(ctx, limit, maxBytes)
}
func (u unwoken) Stats(ctx context.Context) (outbox.Stats, error) { return u.s.Stats(ctx) }
func (u unwoken) Wakeups() <-chan struct{}                        { return nil }

// A batch cut short by BatchBytes while more rows are due is followed by
// the next one at once, as a full batch is, not after a PollInterval. Before,
// the relay read a batch of fewer rows than BatchSize as "nothing more is
// due" and slept its PollInterval (500 ms by default) after each: a backlog
// of 300 rows of 1.5 MB took 28 polls to drain. Here the poll is an hour
// and the store wakes nobody: only taking the next batch at once drains it.
func TestABatchCutShortByBytesIsFollowedAtOnce(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	payload := bytes.Repeat([]byte("x"), 100*1000)
	const rows = 12
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	for range rows {
		require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage(watermill.NewUUID(), payload)))
	}
	require.NoError(t, tx.Commit())
	r, err := outbox.NewRelay(unwoken{s.outbox}, s.rabbit.Publisher(), outbox.RelayConfig{Env: sluice.Env{MeterProvider: s.mp}, BatchBytes: 250 * 1000, PollInterval: time.Hour, StatsInterval: -1})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	require.NoError(t, testenv.AwaitCount(rows, time.Minute, 10*time.Minute, func() int { return rows - s.count("outbox") }),
		"6 batches of 2 rows, each taken at once after the one before")
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.Equal(t, rows, testenv.QueueDepth(t, s.conn, s.produced))
}
