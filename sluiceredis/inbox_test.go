package sluiceredis_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluiceredis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		client, prefix := testenv.Redis(t)
		s, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix})
		require.NoError(t, err)
		return s
	})
}

// TestCommitOutlivesTheHandlersDeadline: a handler that succeeds just as its
// deadline ends (Watermill's Timeout, the shutdown grace running out) is
// committed. On Redis the handler's effects are outside the unit of work: a
// commit failed with the deadline left the key pending and the handler ran
// again after the lease — 2 effects for one successful run.
func TestCommitOutlivesTheHandlersDeadline(t *testing.T) {
	t.Parallel()
	client, prefix := testenv.Redis(t)
	store, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix, Lease: time.Second})
	require.NoError(t, err)
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "mailer"})
	require.NoError(t, err)
	var effects atomic.Int32
	running := make(chan struct{}, 1)
	h := inbox(func(msg *message.Message) ([]*message.Message, error) {
		running <- struct{}{}
		<-msg.Context().Done() // the work ends with the deadline…
		effects.Add(1)         // …and succeeded: the mail is sent
		return nil, nil
	})
	deliver := func() error {
		// The deadline passes once the handler runs (not after a fixed
		// 50 ms: on a loaded machine the claim alone took longer).
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		go func() {
			select {
			case <-running:
				cancel(context.DeadlineExceeded)
			case <-ctx.Done():
			}
		}()
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(sluice.EventIDKey, "evt-1")
		msg.SetContext(ctx)
		_, err := h(msg)
		return err
	}
	require.NoError(t, deliver(), "the successful run is committed")
	keys, err := client.Keys(t.Context(), prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, "done", client.Get(t.Context(), keys[0]).Val(), "recorded as done, not left pending for the lease")
	require.NoError(t, deliver(), "the redelivery is a duplicate, not a claim in progress")
	require.Equal(t, int32(1), effects.Load(), "the redelivery is a duplicate")
}
