package deduplication_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
)

// TestAHandlerThatSucceedsAsItsDeadlinePassesIsCommittedOnce: behind
// Watermill's Timeout (inside its Retry, the composition users build), a
// handler whose writes are done when its deadline passes is committed once
// and not run again. The SQL store's transaction used to be begun on the
// message's context, which database/sql rolls it back on: the commit failed
// ("transaction has already been committed or rolled back"), Retry ran the
// handler a second time, and nothing was committed. The same with
// StoreTimeout negative (no bound): before, the store's Begin was then
// given the message's own context, as the MemoryStore's is ("commit:
// context canceled", the handler run again).
func TestAHandlerThatSucceedsAsItsDeadlinePassesIsCommittedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		batched      bool
		storeTimeout time.Duration
	}{{false, 0}, {true, 0}, {false, -1}, {true, -1}} {
		batched := tc.batched
		t.Run(fmt.Sprintf("batch=%v,StoreTimeout=%v", batched, tc.storeTimeout), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := deduplication.Config{Store: b.store, Consumer: "deadline", Env: sluice.Env{MeterProvider: b.meter, StoreTimeout: tc.storeTimeout}}
			if batched {
				cfg.Batch = &deduplication.BatchConfig{MaxBatch: 4}
			}
			inbox, err := deduplication.New(cfg)
			require.NoError(t, err)
			write := b.reserve(nil)
			h := func(msg *message.Message) ([]*message.Message, error) {
				produced, err := write(msg)
				if err != nil {
					return nil, err
				}
				select { // the writes are done; the deadline passes
				case <-msg.Context().Done():
				case <-time.After(time.Minute):
					return nil, fmt.Errorf("the deadline never passed")
				}
				return produced, nil
			}
			retry := wmiddleware.Retry{MaxRetries: 1}
			stack := retry.Middleware(wmiddleware.Timeout(2 * time.Second)(inbox(h)))

			_, err = stack(event("evt-deadline"))
			require.NoError(t, err)
			require.EqualValues(t, 1, b.handled.Load(), "the handler ran once")
			business, inboxRows := b.rows(t)
			require.Equal(t, 1, business, "its writes are committed")
			require.Equal(t, 1, inboxRows, "its claim is committed")

			_, err = stack(event("evt-deadline"))
			require.NoError(t, err)
			require.EqualValues(t, 1, b.handled.Load(), "a redelivery is a duplicate")
		})
	}
}
