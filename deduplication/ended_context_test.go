package deduplication_test

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
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/unitofwork"
)

// slowBegin is a store whose Begin takes longer than the inbox's grace and
// does not honour its context, as a driver opening a new connection to a
// slow server may not.
type slowBegin struct {
	deduplication.Store
	begun atomic.Int64
}

func (s *slowBegin) Begin(ctx context.Context) (unitofwork.Tx, error) {
	s.begun.Add(1)
	time.Sleep(300 * time.Millisecond) // the fault injected: a Begin that ignores ctx
	return s.Store.Begin(ctx)
}

// A delivery whose context has ended before the inbox asks its store
// anything — Watermill's Retry outside its Timeout hands the second try the
// context the first try's Timeout cancelled — fails with that context's
// error, at once, without asking the store: it is not the store that did
// not answer. Before, the inbox began a unit of work on it, gave up after
// its grace, and reported the store as not answering within StoreTimeout
// (ErrStoreTimeout, a *sluice.DependencyError the brake counts as an
// outage).
func TestADeliveryWhoseContextEndedIsNotAStoreThatDidNotAnswer(t *testing.T) {
	t.Parallel()
	slow := &slowBegin{Store: deduplication.NewMemoryStore()}
	for _, tc := range []struct {
		name  string
		store deduplication.Store
		begun func() int64 // how many units of work the store began, where it can tell
	}{
		// Its calls bounded by StoreTimeout (bounded.Run).
		{"a store whose Begin ignores its context", slow, slow.begun.Load},
		// Its calls run directly (its units of work outlive any context):
		// before, the inbox began one on the ended context, claimed the key
		// and ran the handler.
		{"the memory store", deduplication.NewMemoryStore(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inbox, err := deduplication.New(deduplication.Config{Store: tc.store, Consumer: "c", Env: sluice.Env{StoreTimeout: 10 * time.Second}})
			require.NoError(t, err)
			handled := 0
			h := inbox(func(*message.Message) ([]*message.Message, error) { handled++; return nil, nil })

			msg := message.NewMessage(watermill.NewUUID(), nil)
			msg.Metadata.Set(sluice.EventIDKey, "evt-1")
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			msg.SetContext(ctx)
			_, err = h(msg)
			require.Error(t, err)
			require.ErrorIs(t, err, context.Canceled)
			require.False(t, errors.Is(err, deduplication.ErrStoreTimeout), "not the store's timeout: %v", err)
			require.False(t, errors.Is(err, sluice.ErrDependency), "no outage for the brake to count: %v", err)
			if tc.begun != nil {
				require.Zero(t, tc.begun(), "the store was not asked")
			}
			require.Zero(t, handled)

			msg = message.NewMessage(watermill.NewUUID(), nil)
			msg.Metadata.Set(sluice.EventIDKey, "evt-1")
			_, err = h(msg)
			require.NoError(t, err, "the next delivery, its context live, is processed")
			require.Equal(t, 1, handled)
		})
	}
}
