package rabbitmq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// newConnectionBroker is a Broker on a queue of t's own with conn, its
// queues deleted when t ends.
func newConnectionBroker(t *testing.T, conn rabbitmq.Connection) *rabbitmq.Broker {
	t.Helper()
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: conn,
		Topology: rabbitmq.TopologyConfig{Queue: testenv.Name("connection"), TierDelays: brokerTiers}})
	require.NoError(t, err)
	names := []string{b.Topology().Config().Queue, b.Topology().Config().PoisonQueue}
	for _, tier := range b.Topology().Tiers() {
		names = append(names, tier.Topic)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	return b
}

// The Connection given to NewBroker reaches every connection it makes: a
// DialTimeout bounds the publisher's and the consumer's dial to a broker
// that accepts and never answers (before, BrokerConfig could not carry it
// and both waited DialTimeoutDefault), the consumer reports its failed dial
// to the Logger, and the publisher's confirms reach the MeterProvider.
func TestBrokerConnectionReachesEveryConnection(t *testing.T) {
	t.Parallel()

	t.Run("dial timeout and logger", func(t *testing.T) {
		t.Parallel()
		proxy, url := testenv.ProxyAMQP(t)
		logger := &awaitLog{LoggerAdapter: watermill.NopLogger{}, msg: "Consuming stopped; reconnecting after a backoff", seen: make(chan struct{})}
		// Long enough for NewBroker's own handshake through the proxy on a
		// loaded machine (300 ms failed one at load average 41, with 504),
		// and not DialTimeoutDefault, which the checks below tell it from.
		const dialTimeout = 2 * time.Second
		b := newConnectionBroker(t, rabbitmq.Connection{URL: url, DialTimeout: dialTimeout, Logger: logger})
		defer func() { _ = b.Close() }()
		proxy.BlackHole()

		// Which bound ended each dial is in its error (not read from a
		// clock: a loaded machine took 5.07 s for a 2 s bound once).
		err := b.Publisher().Publish(b.Topology().Config().Queue, message.NewMessage(watermill.NewUUID(), []byte("black hole")))
		require.ErrorContains(t, err, "no answer within DialTimeout (2s)", "the publisher dialed with BrokerConfig's DialTimeout")

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		_, err = b.Endpoints().Subscriber.Subscribe(ctx, b.Topology().Config().Queue)
		require.NoError(t, err)
		select {
		case <-logger.seen:
		case <-time.After(2 * time.Minute): // a liveness bound
			t.Fatal("the consumer's failed dial did not reach BrokerConfig's Logger")
		}
		require.ErrorContains(t, logger.err, "no answer within DialTimeout (2s)", "the consumer dialed with BrokerConfig's DialTimeout")
	})

	t.Run("meter provider", func(t *testing.T) {
		t.Parallel()
		reader := sdkmetric.NewManualReader()
		b := newConnectionBroker(t, rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
		defer func() { _ = b.Close() }()
		require.NoError(t, b.Publisher().Publish(b.Topology().Config().Queue, message.NewMessage(watermill.NewUUID(), []byte("measured"))))

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(t.Context(), &rm))
		var confirms uint64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == telemetry.MetricPublishConfirmDuration {
					for _, dp := range h.DataPoints {
						confirms += dp.Count
					}
				}
			}
		}
		require.Equal(t, uint64(1), confirms, "the publisher's confirm reached BrokerConfig's MeterProvider")
	})
}

// awaitLog is a logger that closes seen at the first error line msg.
type awaitLog struct {
	watermill.LoggerAdapter
	msg  string
	seen chan struct{}
	once sync.Once
	err  error // the first msg's, read after seen
}

func (l *awaitLog) Error(msg string, err error, _ watermill.LogFields) {
	if msg == l.msg {
		l.once.Do(func() { l.err = err; close(l.seen) })
	}
}

func (l *awaitLog) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// A broker that stops answering (a black hole between the client and it)
// holds neither the Publisher's Close nor a Consumer's drain past their
// bounds: each waits for the broker's answer at most WriteTimeout (the
// drain after DrainTimeout). Before, each close waited until the heartbeat
// gave the connection up (15 s with the default heartbeat).
func TestClosingIsBoundedWhenTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	const writeTimeout, drainTimeout = 300 * time.Millisecond, 300 * time.Millisecond
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: url, WriteTimeout: writeTimeout},
		Topology: rabbitmq.TopologyConfig{Queue: testenv.Name("close_bounded")}, DrainTimeout: drainTimeout})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, b.Topology().Config().Queue, b.Topology().Config().PoisonQueue)
	for _, tier := range b.Topology().Tiers() {
		testenv.DeleteQueuesAtEnd(t, tier.Topic)
	}
	// Both connections up: one message published and consumed.
	require.NoError(t, b.Publisher().Publish(b.Topology().Config().Queue, message.NewMessage(watermill.NewUUID(), []byte("up"))))
	deliveries, err := b.Endpoints().Subscriber.Subscribe(t.Context(), b.Topology().Config().Queue)
	require.NoError(t, err)
	(<-deliveries).Ack()

	proxy.BlackHole()
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed: // an error or not: the broker did not answer
		t.Logf("closed: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("closing waited for a broker that answers nothing past WriteTimeout and DrainTimeout; the goroutines:\n%s", testenv.Goroutines())
	}
}

// A Broker's Close is bounded while its consumer and its depth reader are
// dialling a broker that accepts connections and never answers: the dials
// are given up at once, not after DialTimeout (a minute here). Before,
// Close waited for them — the depth reader's redial after a passive declare
// overran WriteTimeout held TestClosingIsBoundedWhenTheBrokerStopsAnswering
// past its 10 s in a loaded run (10.48 s, the default DialTimeout's 10 s).
func TestClosingIsBoundedWhileReconnectingToABlackHole(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	const writeTimeout, drainTimeout, dialTimeout = 300 * time.Millisecond, 300 * time.Millisecond, time.Minute
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: url, WriteTimeout: writeTimeout, DialTimeout: dialTimeout},
		Topology:   rabbitmq.TopologyConfig{Queue: testenv.Name("close_redial")}, DrainTimeout: drainTimeout,
		DepthInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	bothUp(t, b)

	// Every connection cut, and none reaches the broker again: the consumer
	// (after its backoff, 1 s) and the depth reader (at its next read) dial
	// into the black hole.
	proxy.BlackHole()
	before := proxy.Accepted()
	proxy.Reset()
	require.Eventually(t, func() bool { return proxy.Accepted() >= before+2 }, 2*time.Minute, 10*time.Millisecond,
		"the consumer and the depth reader dial again")
	closeWithin(t, b, dialTimeout/3, "closing waited for dials a broker never answers")
}

// closeWithin closes b, failing t with what and the goroutines if Close
// takes longer than d: a third of the DialTimeout whose wait it must not
// take.
func closeWithin(t *testing.T, b *rabbitmq.Broker, d time.Duration, what string) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		t.Logf("closed: %v", err)
	case <-time.After(d):
		t.Fatalf("%s (%s, a third of DialTimeout); the goroutines:\n%s", what, d, testenv.Goroutines())
	}
}

// bothUp deletes b's queues when t ends, and has its consumer and its
// publisher connected: one message published and consumed.
func bothUp(t *testing.T, b *rabbitmq.Broker) {
	t.Helper()
	for _, q := range b.Topology().Queues() {
		testenv.DeleteQueuesAtEnd(t, q.Name)
	}
	deliveries, err := b.Endpoints().Subscriber.Subscribe(t.Context(), b.Topology().Config().Queue)
	require.NoError(t, err)
	require.NoError(t, b.Publisher().Publish(b.Topology().Config().Queue, message.NewMessage(watermill.NewUUID(), []byte("up"))))
	(<-deliveries).Ack()
}

// A Broker closed while its connections are being opened again leaves
// none open: its consumer, its publisher and its depth reader each lost
// their connection and dialed again, the broker's first reply to each dial
// is held until Close has returned, and then every connection dialed must
// still close, and Close gives those dials up at once, not after
// DialTimeout. A connection that outlives Close keeps its reader and
// heartbeater goroutines and a connection on the broker for the life of the
// program. (watermill-amqp's subscriber leaves one:
// TestUpstreamWatermillSubscriberLeavesAConnectionWhenClosedWhileReconnecting.)
func TestABrokerClosedWhileReconnectingLeavesNoConnection(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	const dialTimeout = time.Minute
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: url, DialTimeout: dialTimeout},
		Topology:   rabbitmq.TopologyConfig{Queue: testenv.Name("close_held")}, DepthInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	bothUp(t, b)

	release := proxy.HoldFirstReplies()
	defer release()
	proxy.Reset()
	// The consumer (after its backoff) and the depth reader (at its next
	// read) dial again, and so does the publisher for a publish: the first
	// may fail at once on the lost connection (uncertain), the next waits
	// for the dial until Close ends it.
	stop, publishing := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(publishing)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = b.Publisher().Publish(b.Topology().Config().Queue, message.NewMessage(watermill.NewUUID(), []byte("held")))
		}
	}()
	require.Eventually(t, func() bool { return proxy.Held() >= 3 }, 2*time.Minute, 10*time.Millisecond,
		"the consumer, the publisher and the depth reader dial again (%d wait in their handshake)", proxy.Held())
	close(stop)
	closeWithin(t, b, dialTimeout/3, "Close waited for dials whose handshake the broker holds")
	<-publishing // Close ended the publish waiting for the dial
	release()
	require.Eventually(t, func() bool { return proxy.Forwarding() == 0 }, time.Minute, 10*time.Millisecond,
		"%d connections of the closed broker left open", proxy.Forwarding())
}

// A Broker's Endpoints say how many deliveries each consumer hands the
// router at once — BrokerConfig.Prefetch (16 by default), one with
// WatermillSubscriber — which router.Add gives a batch handler
// (BatchHandler.InFlight), so that a batch closes once they are all in it.
func TestBrokerEndpointsSayThePrefetch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  rabbitmq.BrokerConfig
		want int
	}{
		{"default", rabbitmq.BrokerConfig{}, 16},
		{"set", rabbitmq.BrokerConfig{Prefetch: 40}, 40},
		{"watermill subscriber", rabbitmq.BrokerConfig{Prefetch: 40, WatermillSubscriber: true}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.Connection = rabbitmq.Connection{URL: testenv.AMQPURL}
			cfg.Topology = rabbitmq.TopologyConfig{Queue: testenv.Name("prefetch")}
			b, err := rabbitmq.NewBroker(t.Context(), cfg)
			require.NoError(t, err)
			names := []string{b.Topology().Config().Queue, b.Topology().Config().PoisonQueue}
			for _, tier := range b.Topology().Tiers() {
				names = append(names, tier.Topic)
			}
			testenv.DeleteQueuesAtEnd(t, names...)
			t.Cleanup(func() { _ = b.Close() })
			require.Equal(t, tt.want, b.Endpoints().Prefetch)
		})
	}
}
