package rabbitmq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A broker that accepts the connection and never answers the handshake
// holds no publish past its message's context: the dial runs outside the
// publisher's lock, every caller waits for the same one, and each returns
// when its own context ends, with an error the outbox's relay reads as
// unreachable (it does not push its rows back). Close gives the dial up at
// once; after the heal the publisher connects.
func TestAStalledDialHoldsNoPublishPastItsContext(t *testing.T) {
	t.Parallel()
	q := declareQueue(t, "stalled_dial")
	proxy, url := testenv.ProxyAMQP(t)
	proxy.BlackHole()
	t.Cleanup(proxy.Heal)
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url, DialTimeout: time.Minute}})
	require.NoError(t, err)

	publish := func(d time.Duration) (error, time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		m.SetContext(ctx)
		start := time.Now()
		err := p.Publish(q, m)
		return err, time.Since(start)
	}
	var wg sync.WaitGroup
	for _, d := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond} {
		wg.Go(func() {
			err, took := publish(d)
			require.Error(t, err)
			require.True(t, sluice.Unreachable(err), "unreachable, not uncertain: %v", err)
			require.Less(t, took, d+5*time.Second, "returned when its context ended, not after the dial (DialTimeout a minute)")
		})
	}
	wg.Wait()

	proxy.Heal() // resets the stalled handshake: the next publish dials again
	require.Eventually(t, func() bool { err, _ := publish(10 * time.Second); return err == nil }, 2*time.Minute, 50*time.Millisecond)
	require.NoError(t, p.Close())

	// Close ends a dial in progress at once.
	p2, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url, DialTimeout: time.Minute}})
	require.NoError(t, err)
	proxy.BlackHole()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.SetContext(ctx)
	require.Error(t, p2.Publish(q, m))
	start := time.Now()
	require.NoError(t, p2.Close())
	require.Less(t, time.Since(start), 5*time.Second, "Close gave the dial up")
}
