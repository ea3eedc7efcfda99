package sluicesql_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"

	"github.com/sluicemq/sluice/sluicesql"
)

// A batch handler writes what each event produces through the outbox on
// that event's context: the rows commit with the batch, and an event that
// leaves the batch (Transient) takes its rows with it — the batch's second
// run without it writes the others' once, not twice. The commit wakes the
// relay.
func TestABatchHandlerProducesEachEventsMessagesWithIt(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	in := testenv.SQLStore(t, db, schema+".inbox")
	ob, err := sluicesql.NewOutbox(db, sluicesql.OutboxConfig{Table: schema + ".outbox"})
	require.NoError(t, err)
	require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), ob))
	var runs int
	handle, err := deduplication.NewBatchHandler(deduplication.Config{Store: in, Consumer: "c"}, deduplication.BatchHandler{
		MaxBatch: 4, MaxWait: time.Second,
		Handle: func(_ context.Context, msgs []*message.Message) []error {
			runs++
			out := make([]error, len(msgs))
			for i, m := range msgs {
				key := m.Metadata.Get(sluice.EventIDKey)
				if err := ob.Publish(m.Context(), "produced", message.NewMessage("from-"+key, nil)); err != nil {
					out[i] = err
					continue
				}
				if key == "k2" {
					out[i] = sluice.Transient(errors.New("stock service down"))
				}
			}
			return out
		},
	})
	require.NoError(t, err)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i, key := range []string{"k0", "k1", "k2", "k3"} {
		wg.Go(func() {
			msg := message.NewMessage("delivery-"+key, nil)
			msg.Metadata.Set(sluice.EventIDKey, key)
			msg.SetContext(context.Background())
			_, errs[i] = handle(msg)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i == 2 {
			require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))
			continue
		}
		require.NoError(t, err)
	}
	require.Equal(t, 2, runs, "the batch ran again without the failed event")
	select {
	case <-ob.Wakeups():
	default:
		t.Fatal("the commit woke the relay")
	}
	b, err := ob.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	var ids []string
	for _, r := range b.Rows() {
		ids = append(ids, r.Message.UUID)
		require.NotContains(t, []string{"k0", "k1", "k3"}, r.Message.Metadata.Get(sluice.EventIDKey), "an event id of its own")
	}
	slices.Sort(ids)
	require.Equal(t, []string{"from-k0", "from-k1", "from-k3"}, ids)
	require.NoError(t, b.Release(t.Context()))
}
