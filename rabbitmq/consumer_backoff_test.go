package rabbitmq_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A subscription whose connection fails after it was consuming reconnects
// after the first reconnection backoff, however many failures came before — a
// consumer on a cluster moves to another node each time its node dies.
// Before, the backoff doubled on every failure for the subscription's whole
// life: the fourth reset here waited 8 × the backoff (2.4 s), the
// fifth 16 × (4.8 s), and the test failed. The backoff each reconnection
// waits is read from the consumer's log line, not from a clock: a loaded
// machine takes longer to reconnect, not a longer backoff.
func TestConsumerBackoffStartsAgainAfterAConnectionThatConsumed(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	q := declareQueue(t, "consumer_backoff")
	const backoff = 300 * time.Millisecond
	logged := &backoffLogger{}
	c, err := rabbitmq.NewConsumer(rabbitmq.WithReconnectBackoff(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: url, DialTimeout: 5 * time.Second, Logger: logged}}, backoff))
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	deliveries, err := c.Subscribe(ctx, q)
	require.NoError(t, err)
	pub := newPublisher(t, "")

	for i := range 6 {
		before := logged.len()
		if i > 0 {
			proxy.Heal() // resets the subscription's connection
		}
		sent := msgs(1)[0]
		require.NoError(t, pub.Publish(q, sent))
		timeout := time.After(time.Minute)
		for got := false; !got; { // a message acked just before a reset comes again
			select {
			case msg := <-deliveries:
				msg.Ack()
				got = msg.UUID == sent.UUID
			case <-timeout:
				t.Fatalf("reset %d: the message not delivered in a minute", i)
			}
		}
		if i > 0 {
			waits := logged.since(before)
			require.NotEmpty(t, waits, "reset %d: the reconnection is logged with its backoff", i)
			require.Equal(t, backoff.String(), waits[0], "reset %d: the first reconnection after a connection that consumed waits the backoff (waited %v)", i, waits)
		}
	}
}

// backoffLogger keeps the backoff of each "reconnecting after a backoff" line.
type backoffLogger struct {
	watermill.NopLogger
	mu    sync.Mutex
	waits []string
}

func (l *backoffLogger) Error(msg string, _ error, fields watermill.LogFields) {
	if !strings.HasPrefix(msg, "Consuming stopped; reconnecting after a backoff") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waits = append(l.waits, fmt.Sprint(fields["backoff"]))
}

func (l *backoffLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *backoffLogger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waits)
}

func (l *backoffLogger) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.waits[n:]...)
}
