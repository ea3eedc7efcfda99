package outbox_test

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

// heldFirst holds its first Publish until release is closed, and counts
// the messages it passed on.
type heldFirst struct {
	pub       message.Publisher
	started   chan struct{}
	release   chan struct{}
	once      sync.Once
	published atomic.Int64
}

func (h *heldFirst) Publish(topic string, msgs ...*message.Message) error {
	h.once.Do(func() {
		close(h.started)
		<-h.release
	})
	if err := h.pub.Publish(topic, msgs...); err != nil {
		return err
	}
	h.published.Add(int64(len(msgs)))
	return nil
}

func (h *heldFirst) Close() error { return nil }

// sqliteOutbox is a SQLite outbox holding rows rows for topic "produced".
func sqliteOutbox(t *testing.T, rows int) *sluicesql.Outbox {
	t.Helper()
	db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "app.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store := testenv.Migrate(t, db, sluicesql.Config{}).Outbox
	tx, err := db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	msgs := make([]*message.Message, rows)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
	}
	require.NoError(t, store.Write(t.Context(), tx, "produced", msgs...))
	require.NoError(t, tx.Commit())
	return store
}

// closeWhileHeld runs r, waits for held, calls Close and, once it has
// been called, closes release; it returns when Run has.
func closeWhileHeld(t *testing.T, r *outbox.Relay, held <-chan struct{}, release chan struct{}) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-held
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	<-outbox.Closing(r) // Close was called; the hold goes on
	close(release)
	require.NoError(t, <-closed)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after Close")
	}
}

// Issue 43, item 5: Close while a batch's publish is held — Run finishes
// that batch and returns, taking no other. The embedded default, a SQLite
// outbox of 300 rows, batches of 20, the first publish held on a channel
// until Close has been called. (The 60 rows, 3 batches, came from a
// Close on a goroutine that had not run yet when the publish was released:
// 20 to 300 rows in 30 such runs. With Close called first, 20, before and
// after the fix below.)
func TestCloseFinishesOnlyTheBatchInFlight(t *testing.T) {
	t.Parallel()
	const rows, batch = 300, 20
	store := sqliteOutbox(t, rows)
	b, err := embedded.New(embedded.Config{Topic: "orders", MaxQueued: 2 * rows})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	pub := &heldFirst{pub: b.PubSub().Publisher(), started: make(chan struct{}), release: make(chan struct{})}
	r, err := outbox.NewRelay(store, pub, outbox.RelayConfig{BatchSize: batch, StatsInterval: -1})
	require.NoError(t, err)
	closeWhileHeld(t, r, pub.started, pub.release)
	require.EqualValues(t, batch, pub.published.Load(), "the batch in flight, and no other")
	st, err := store.Stats(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, rows-batch, st.Pending, "the rest stays in the outbox")
}

// heldDue holds its first Due until release is closed.
type heldDue struct {
	*sluicesql.Outbox
	entered, release chan struct{}
	once             sync.Once
}

func (h *heldDue) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	h.once.Do(func() {
		close(h.entered)
		<-h.release
	})
	return h.Outbox.Due(ctx, limit, maxBytes)
}

// Issue 43, item 5: a batch whose taking ends after Close was called is
// given back unpublished — Close finishes the publishes begun before it,
// and begins none. Before, the batch taken as Close was called was
// published (20 rows after Close).
func TestABatchTakenAsCloseIsCalledIsGivenBack(t *testing.T) {
	t.Parallel()
	const rows, batch = 300, 20
	store := &heldDue{Outbox: sqliteOutbox(t, rows), entered: make(chan struct{}), release: make(chan struct{})}
	b, err := embedded.New(embedded.Config{Topic: "orders", MaxQueued: 2 * rows})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	pub := &heldFirst{pub: b.PubSub().Publisher(), started: make(chan struct{}), release: make(chan struct{})}
	close(pub.release) // nothing held there
	r, err := outbox.NewRelay(store, pub, outbox.RelayConfig{BatchSize: batch, StatsInterval: -1})
	require.NoError(t, err)
	closeWhileHeld(t, r, store.entered, store.release)
	require.Zero(t, pub.published.Load(), "nothing published after Close was called")
	st, err := store.Stats(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, rows, st.Pending, "every row stays in the outbox")
	due, err := store.Outbox.Due(t.Context(), rows, 0)
	require.NoError(t, err)
	require.Len(t, due.Rows(), rows, "the batch given back is due again at once")
	require.NoError(t, due.Release(t.Context()))
}
