package deduplication_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// The quick start on the MemoryStore, on RabbitMQ, behind Watermill's Retry
// outside its Timeout: the retries of a failed try start with their context
// ended (the next Timeout derives from the one that ended), and the inbox
// asks its store nothing then — no handler runs on an ended context; Retry
// gives up, the delivery is nacked and its redelivery is handled, once.
// Before (3fb5958 to 2a4c5e2), the memory inbox claimed the key on the ended
// context and ran the handler again.
func TestTheMemoryInboxBehindWatermillsRetryOutsideItsTimeout(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("memory_retry")
	testenv.DeleteQueuesNowAndAtEnd(t, queue)
	cfg, err := rabbitmq.WithMarshaler(amqp.NewDurableQueueConfig(testenv.AMQPURL))
	require.NoError(t, err)
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	require.NoError(t, err)
	inbox, err := deduplication.New(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "inventory", Key: sluice.KeyFromJSON("eventId")})
	require.NoError(t, err)

	var (
		mu      sync.Mutex
		calls   = map[string]int{} // handler runs by event
		onEnded int                // runs on an ended context
	)
	observe, failedDeliveries := observed() // what a delivery's tries ended with, once Retry gave up
	done := make(chan string, 4)
	handler := func(msg *message.Message) error {
		id := msg.Metadata.Get(sluice.EventIDKey)
		mu.Lock()
		defer mu.Unlock()
		calls[id]++
		if msg.Context().Err() != nil {
			onEnded++
		}
		if id == "evt-1" && calls[id] == 1 {
			return errors.New("the first try fails")
		}
		done <- id
		return nil
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(observe, wmiddleware.Retry{MaxRetries: 2, InitialInterval: 10 * time.Millisecond, Logger: watermill.NopLogger{}}.Middleware,
		wmiddleware.Timeout(time.Minute))
	r.AddConsumerHandler("inventory", queue, sub, handler).AddMiddleware(inbox)
	running := runRouter(r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-running)
	})

	ch := testenv.Channel(t, testenv.AMQP(t))
	publishRaw(t, ch, queue, `{"eventId":"evt-1"}`, nil)
	publishRaw(t, ch, queue, `{"eventId":"evt-2"}`, amqp091.Table{"__TypeId__": "com.example.OrderCreated", "schemaVersion": int32(3)}) // a Spring producer's
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-done:
			got[id] = true
		case <-time.After(2 * time.Minute):
			t.Fatalf("handled %v of evt-1 and evt-2", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, onEnded, "no handler ran on an ended context")
	require.Equal(t, map[string]int{"evt-1": 2, "evt-2": 1}, calls, "evt-1: its failed first try and its redelivery")
	failed := failedDeliveries()
	require.Len(t, failed, 1, "one delivery failed its tries, and was nacked")
	require.ErrorIs(t, failed[0], context.Canceled, "its retries failed on their ended context")
}
