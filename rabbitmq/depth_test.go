package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// gauges collects reader and returns the int64 gauge name's values by
// queue, with each point's role and family.
func gauges(t *testing.T, reader *sdkmetric.ManualReader, name string) map[string]string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				q, _ := dp.Attributes.Value("messaging.destination.name")
				role, _ := dp.Attributes.Value(telemetry.AttrQueueRole)
				family, _ := dp.Attributes.Value(telemetry.AttrQueueFamily)
				vhost, _ := dp.Attributes.Value(telemetry.AttrQueueVhost)
				sys, _ := dp.Attributes.Value("messaging.system")
				out[q.AsString()] = fmt.Sprintf("%d %s %s %s %s", dp.Value, role.AsString(), family.AsString(), vhost.AsString(), sys.AsString())
			}
		}
	}
	return out
}

// The Broker reads the depth of its queues — the consumer queue, each tier,
// the poison queue — and exports them as gauges labelled by queue, role and
// family, without RabbitMQ's Prometheus plugin. A delivery taken and not
// acked is not counted as ready, on classic and quorum queues alike
// (RabbitMQ 3.10's queue.declare-ok); the consumer holding it is.
func TestTheBrokerExportsItsQueuesDepths(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		t.Run(fmt.Sprintf("quorum=%v", quorum), func(t *testing.T) {
			t.Parallel()
			reader := sdkmetric.NewManualReader()
			queue := testenv.Name("depth")
			b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
				Connection:    rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
				Topology:      rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{time.Hour}, Quorum: quorum},
				DepthInterval: 50 * time.Millisecond,
			})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, b.Close()) })
			testenv.DeleteQueuesAtEnd(t, queue, queue+".retry.1h", queue+".poison")
			require.Equal(t, []rabbitmq.TopologyQueue{{Name: queue, Role: rabbitmq.RoleMain}, {Name: queue + ".retry.1h", Role: rabbitmq.RoleTier, Tier: "1h"},
				{Name: queue + ".poison", Role: rabbitmq.RolePoison}}, b.Topology().Queues())

			conn := testenv.AMQP(t)
			ch := testenv.Channel(t, conn)
			for q, n := range map[string]int{queue: 3, queue + ".retry.1h": 1, queue + ".poison": 2} {
				for range n {
					require.NoError(t, ch.PublishWithContext(t.Context(), "", q, true, false, amqp.Publishing{Body: []byte("x")}))
				}
			}
			holder := testenv.Channel(t, conn)
			require.NoError(t, holder.Qos(1, 0, false))
			deliveries, err := holder.Consume(queue, "", false, false, false, false, nil)
			require.NoError(t, err)
			<-deliveries // taken, not acked

			want := map[string]string{
				queue:               "2 main " + queue + " / rabbitmq",
				queue + ".retry.1h": "1 tier " + queue + " / rabbitmq",
				queue + ".poison":   "2 poison " + queue + " / rabbitmq",
			}
			require.Eventually(t, func() bool {
				got := gauges(t, reader, telemetry.MetricQueueReady)
				return fmt.Sprint(got) == fmt.Sprint(want)
			}, time.Minute, 20*time.Millisecond, "ready: %v", gauges(t, reader, telemetry.MetricQueueReady))
			require.Equal(t, "1 main "+queue+" / rabbitmq", gauges(t, reader, telemetry.MetricQueueConsumers)[queue])
			for _, d := range b.Depths() {
				require.NoError(t, d.Err)
				require.False(t, d.At.IsZero())
			}
			require.Equal(t, 2, b.Depths()[0].Ready)
			require.Equal(t, 1, b.Depths()[0].Consumers)
		})
	}
}

// Every read is bounded: a broker that stops answering leaves the gauges
// at their last values with the read's error in Depths, and the Broker
// closes at once; once it answers again, the reads resume. A queue deleted
// under the Broker is reported missing (ErrQueueNotFound) while the others
// are still read.
func TestTheDepthReadsAreBounded(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	queue := testenv.Name("depth_bounded")
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		// A dial of 1 s: NewBroker's first connection and handshake took
		// over 300 ms under make test's load; with 2 s, Close under load
		// went past the 5 s the test allows (it waits for a dial in flight).
		Connection:    rabbitmq.Connection{URL: url, WriteTimeout: 300 * time.Millisecond, DialTimeout: time.Second},
		Topology:      rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{time.Hour}},
		DepthInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".retry.1h", queue+".poison")
	read := func() bool {
		for _, d := range b.Depths() {
			if d.Err != nil || d.At.IsZero() {
				return false
			}
		}
		return true
	}
	require.Eventually(t, read, time.Minute, 10*time.Millisecond)

	testenv.Channel(t, testenv.AMQP(t)).QueueDelete(queue+".retry.1h", false, false, false) //nolint:errcheck // checked below
	require.Eventually(t, func() bool {
		d := b.Depths()
		return d[1].Err != nil && d[0].Err == nil && d[2].Err == nil && time.Since(d[2].At) < time.Second
	}, time.Minute, 10*time.Millisecond, "the missing tier is reported, the others read")
	require.ErrorIs(t, b.Depths()[1].Err, rabbitmq.ErrQueueNotFound)
	require.ErrorContains(t, b.Depths()[1].Err, queue+".retry.1h")

	proxy.BlackHole()
	require.Eventually(t, func() bool { return b.Depths()[0].Err != nil }, time.Minute, 10*time.Millisecond, "a read the broker never answers fails")
	proxy.Heal()
	require.Eventually(t, func() bool { return b.Depths()[0].Err == nil }, time.Minute, 10*time.Millisecond, "the reads resume")

	proxy.BlackHole()
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("closing waited on a depth read the broker never answers")
	}
}

// The depth gauges follow the MeterProvider router.Add hands the Broker
// (UseMeterProvider), as its publisher's metrics do; a negative
// DepthInterval reads nothing.
func TestTheDepthGaugesUseTheProviderHanded(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("depth_adopt")
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: queue}, DepthInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	testenv.DeleteQueuesAtEnd(t, queue, queue+".retry.30s", queue+".retry.5m", queue+".retry.30m", queue+".poison")
	reader := sdkmetric.NewManualReader()
	require.NoError(t, b.UseMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.Eventually(t, func() bool { return len(gauges(t, reader, telemetry.MetricQueueReady)) == 5 }, time.Minute, 20*time.Millisecond)

	off, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: queue}, DepthInterval: -1,
	})
	require.NoError(t, err)
	require.Nil(t, off.Depths())
	require.NoError(t, off.Close())
}

// A quorum queue's leader that does not answer within 250 ms makes RabbitMQ
// count its queue 0 messages and 0 consumers (rabbit_quorum_queue:stat/2):
// here the poison queue's Ra server is suspended, on a private node, until
// a second count's query is in its mailbox. The read the test asks for then
// still shows the poison queue's 3 messages: a 0 after a count of some is
// read again before the gauges show it; one that lasts is shown only when
// the next read counts 0 too. Before: that read showed 0.
func TestAQuorumQueuesFalseZeroIsReadAgain(t *testing.T) {
	t.Parallel()
	node := plainNodeFor(t)
	queue := testenv.Name("depthz")
	cfg := rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{time.Hour}, Quorum: true}
	topo, err := rabbitmq.NewTopology(cfg)
	require.NoError(t, err)
	conn, err := amqp.Dial(node.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = topo.Declare(t.Context(), conn)
	require.NoError(t, err)
	ch := testenv.Confirm(t, testenv.Channel(t, conn))
	poisonQ := topo.Config().PoisonQueue
	for range 3 {
		require.NoError(t, ch.PublishWithContext(t.Context(), "", poisonQ, true, false, amqp.Publishing{Body: []byte("x")}))
	}

	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: node.URL}, Topology: cfg,
		DepthInterval: time.Hour, // reads at its start and when the test asks
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	poison := func() rabbitmq.QueueDepth { return b.Depths()[2] }
	require.Equal(t, poisonQ, poison().Name)
	require.Eventually(t, func() bool { return !poison().At.IsZero() }, time.Minute, 10*time.Millisecond, "the first read")
	require.Equal(t, 3, poison().Ready)

	resumed := node.StallQuorumLeader(t, poisonQ, "query_stat", 2)
	before := poison().At
	rabbitmq.ReadDepthsNow(b)
	require.Eventually(t, func() bool { return poison().At.After(before) }, 2*time.Minute, 10*time.Millisecond, "the read asked for")
	require.Equal(t, 3, poison().Ready, "the read asked for, while the leader was stalled")
	require.NoError(t, poison().Err)
	resumed()

	// A leader out for longer: the read's three counts time out, and the
	// depth keeps its 3 with the error saying why, until the next read.
	resumed = node.StallQuorumLeader(t, poisonQ, "query_stat", 4)
	rabbitmq.ReadDepthsNow(b)
	require.Eventually(t, func() bool { return poison().Err != nil }, 2*time.Minute, 10*time.Millisecond, "the read asked for")
	require.ErrorContains(t, poison().Err, "counted 0 messages and 0 consumers three times")
	require.Equal(t, 3, poison().Ready, "kept")
	before = poison().At
	rabbitmq.ReadDepthsNow(b) // its count's query is the fourth: the leader answers it
	require.Eventually(t, func() bool { return poison().At.After(before) }, 2*time.Minute, 10*time.Millisecond, "the next read")
	require.Equal(t, 3, poison().Ready)
	require.NoError(t, poison().Err)
	resumed()

	// Drained for real: the 0 is shown a read late.
	testenv.Drain(t, conn, poisonQ)
	rabbitmq.ReadDepthsNow(b)
	require.Eventually(t, func() bool { return poison().Err != nil }, 2*time.Minute, 10*time.Millisecond, "the read after the drain")
	before = poison().At
	rabbitmq.ReadDepthsNow(b)
	require.Eventually(t, func() bool { return poison().At.After(before) }, 2*time.Minute, 10*time.Millisecond, "the read after that")
	require.Zero(t, poison().Ready)
	require.NoError(t, poison().Err)
}
