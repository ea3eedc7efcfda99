//go:build restart

package rabbitmq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// TestBrokerRestartNeverSilentSuccess restarts RabbitMQ (rabbitmqctl
// stop_app/start_app) while messages are being published with confirms:
// every Publish that returned nil must be in the durable queue afterwards,
// and the publisher must recover by itself. It restarts the broker, so it
// runs on its own: go test -tags restart -run Restart ./rabbitmq/ (make test
// does).
func TestBrokerRestartNeverSilentSuccess(t *testing.T) {
	q := declareQueue(t, "restart")
	p := newPublisher(t, "")

	var stop atomic.Bool
	var ok, failed atomic.Int64
	confirmed := map[string]bool{} // written by the publishing goroutine only
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stop.Load(); i++ {
			m := message.NewMessage(watermill.NewUUID(), nil)
			id := fmt.Sprint("evt-", i)
			m.Metadata.Set("sluice_event_id", id)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			m.SetContext(ctx)
			if err := p.Publish(q, m); err != nil {
				failed.Add(1)
				time.Sleep(50 * time.Millisecond)
			} else {
				confirmed[id] = true
				ok.Add(1)
			}
			cancel()
		}
	}()

	confirmedAtLeast := func(n int64) func() int { return func() int { return int(min(ok.Load(), n)) } }
	require.NoError(t, testenv.AwaitCount(50, time.Minute, 10*time.Minute, confirmedAtLeast(50)), "50 publishes confirmed before the restart")
	// Down a second, while the publisher keeps publishing; a start that
	// RabbitMQ 4.0 refuses is retried (testenv.StartApp).
	r, err := testenv.RestartApp(context.Background(), testenv.TryRabbitmqctl, testenv.RabbitMQRoot, time.Second)
	require.NoError(t, err, "restarting the broker")
	t.Logf("broker restarted: %s", r.Boot)
	afterRestart := ok.Load()
	require.NoError(t, testenv.AwaitCount(int(afterRestart+50), time.Minute, 10*time.Minute, confirmedAtLeast(afterRestart+50)),
		"the publisher recovers by itself after the restart: 50 more publishes confirmed")
	stop.Store(true)
	<-done

	require.Positive(t, failed.Load(), "publishes failed with an error while the broker was down")
	stored := map[string]bool{}
	for _, d := range testenv.Drain(t, testenv.AMQP(t), q) {
		stored[fmt.Sprint(d.Headers["sluice_event_id"])] = true
	}
	for id := range confirmed {
		require.True(t, stored[id], "%s was confirmed but is not in the queue: a silent success", id)
	}
	t.Logf("%d confirmed, all stored (%d stored in all); %d publishes returned an error during the restart",
		len(confirmed), len(stored), failed.Load())
}
