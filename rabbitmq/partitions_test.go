package rabbitmq_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

const partitionKey = "account_id"

// newPartitionedBroker is a Broker on a partitioned topology of t's own
// (PartitionKey partitionKey), its queues and exchange deleted when t ends.
func newPartitionedBroker(t *testing.T, url string, cfg rabbitmq.TopologyConfig) *rabbitmq.Broker {
	t.Helper()
	if cfg.Queue == "" {
		cfg.Queue = testenv.Name("part")
	}
	if cfg.PartitionKey == "" {
		cfg.PartitionKey = partitionKey
	}
	topo, err := rabbitmq.NewTopology(cfg)
	require.NoError(t, err)
	names := []string{"exchange:" + topo.Config().Exchange}
	for _, q := range topo.Queues() {
		names = append(names, q.Name)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: url}, Topology: cfg,
		DepthInterval: -1, DrainTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

// ctlJSON runs rabbitmqctl args with the JSON formatter against the broker
// under test and decodes its output into v.
func ctlJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := testenv.Rabbitmqctl(t, append([]string{"-q"}, append(args, "--formatter", "json")...)...)
	require.NoError(t, json.Unmarshal([]byte(out), v), out)
}

// ctlArgs turns rabbitmqctl's JSON arguments ([name, type, value] each)
// into a map.
func ctlArgs(args [][]any) map[string]any {
	m := map[string]any{}
	for _, a := range args {
		m[a[0].(string)] = a[2]
	}
	return m
}

func keyed(key string, seq int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"seq":%d}`, seq))
	m.Metadata.Set(partitionKey, key)
	m.Metadata.Set("seq", strconv.Itoa(seq))
	return m
}

// TestPartitionedTopologyDeclares declares a topology of 3 partitions and
// reads it back from the broker (rabbitmqctl): the consistent-hash
// exchange hashing the header, each partition queue bound with weight 1
// and declared with single active consumer, its own tiers returning to it,
// one poison queue; classic and quorum. Both are declared first and read
// back by one listing of each kind (each rabbitmqctl is an Erlang VM of
// its own, and lists every queue of the shared broker).
func TestPartitionedTopologyDeclares(t *testing.T) {
	t.Parallel()
	brokers := map[bool]*rabbitmq.Broker{}
	for _, quorum := range []bool{false, true} {
		cfg := rabbitmq.TopologyConfig{Partitions: 3, TierDelays: []time.Duration{time.Second, 2 * time.Second}, Quorum: quorum}
		if quorum {
			cfg.DeliveryLimit = 5
		}
		b := newPartitionedBroker(t, testenv.AMQPURL, cfg)
		_, err := b.Topology().Declare(t.Context(), testenv.AMQP(t))
		require.NoError(t, err, "Declare is idempotent")
		brokers[quorum] = b
	}
	type exchange struct {
		Name, Type string
		Arguments  [][]any
	}
	var exchanges []exchange
	ctlJSON(t, &exchanges, "list_exchanges", "name", "type", "arguments")
	var bindings []struct {
		Source      string `json:"source_name"`
		Destination string `json:"destination_name"`
		RoutingKey  string `json:"routing_key"`
	}
	ctlJSON(t, &bindings, "list_bindings", "source_name", "destination_name", "routing_key")
	var queues []struct {
		Name      string
		Arguments [][]any
	}
	ctlJSON(t, &queues, "list_queues", "name", "arguments")

	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) {
			b := brokers[quorum]
			topo := b.Topology()
			q := topo.Config().Queue

			i := slices.IndexFunc(exchanges, func(e exchange) bool { return e.Name == q })
			require.GreaterOrEqual(t, i, 0, "the exchange is named after the queue")
			require.Equal(t, "x-consistent-hash", exchanges[i].Type)
			require.Equal(t, map[string]any{"hash-header": partitionKey}, ctlArgs(exchanges[i].Arguments))

			var bound []string
			for _, bd := range bindings {
				if bd.Source == q {
					require.Equal(t, "1", bd.RoutingKey, "each partition's weight")
					bound = append(bound, bd.Destination)
				}
			}
			slices.Sort(bound)
			require.Equal(t, []string{q + ".p0", q + ".p1", q + ".p2"}, bound)

			got := map[string]map[string]any{}
			for _, qu := range queues {
				if strings.HasPrefix(qu.Name, q+".") {
					got[qu.Name] = ctlArgs(qu.Arguments)
				}
			}
			require.Len(t, got, 3*3+1, "3 partition queues with 2 tiers each, one poison queue: %v", got)
			for p := range 3 {
				pq := fmt.Sprintf("%s.p%d", q, p)
				require.Equal(t, true, got[pq]["x-single-active-consumer"], pq)
				for _, tier := range []string{".retry.1s", ".retry.2s"} {
					require.Equal(t, pq, got[pq+tier]["x-dead-letter-routing-key"], "the tier returns to its partition only")
					require.Nil(t, got[pq+tier]["x-single-active-consumer"])
				}
				if quorum {
					require.Equal(t, "quorum", got[pq]["x-queue-type"])
					require.Equal(t, q+".poison", got[pq]["x-dead-letter-routing-key"], "the shared poison queue")
					require.EqualValues(t, 5, got[pq]["x-delivery-limit"])
				}
			}
			require.Contains(t, got, q+".poison")

			e := b.Endpoints()
			require.Equal(t, q, e.Topic, "producers publish to the exchange")
			_, err := e.Subscriber.Subscribe(t.Context(), e.Topic)
			require.ErrorIs(t, err, rabbitmq.ErrPartitioned)
			var pb broker.Broker = b
			parts := pb.(broker.Partitioned).Partitions()
			require.Len(t, parts, 3)
			for p, part := range parts {
				pe := part.Endpoints()
				require.Equal(t, fmt.Sprintf("%s.p%d", q, p), pe.Topic)
				require.Equal(t, q+".poison", pe.PoisonTopic)
				require.Len(t, pe.Tiers, 2)
				require.Equal(t, pe.Topic+".retry.1s", pe.Tiers[0].Topic)
				require.NotNil(t, pe.Subscriber)
				require.Same(t, b.Publisher(), pe.RetryPublisher)
			}
		})
	}
}

// TestPartitionedSpreadsKeys publishes 100 keys × 3 messages through the
// PartitionPublisher: every message of a key lands in one partition, in
// publish order, and every partition gets some keys.
func TestPartitionedSpreadsKeys(t *testing.T) {
	t.Parallel()
	const partitions, keys, perKey = 4, 100, 3
	b := newPartitionedBroker(t, testenv.AMQPURL, rabbitmq.TopologyConfig{Partitions: partitions})
	pub := b.PartitionPublisher()
	var batch []*message.Message
	for seq := range perKey {
		for k := range keys {
			batch = append(batch, keyed(fmt.Sprintf("acct-%d", k), seq))
		}
	}
	require.NoError(t, pub.Publish(b.Endpoints().Topic, batch...))

	conn := testenv.AMQP(t)
	where := map[string][]int{} // key → the partition of each of its messages, in order
	for p, part := range b.Partitions() {
		got := testenv.Drain(t, conn, part.Endpoints().Topic)
		require.NotEmpty(t, got, "partition %d got no key of %d", p, keys)
		last := map[string]int{}
		for _, d := range got {
			key := d.Headers[partitionKey].(string)
			seq, err := strconv.Atoi(d.Headers["seq"].(string))
			require.NoError(t, err)
			prev, seen := last[key]
			require.True(t, !seen && seq == 0 || seen && seq == prev+1, "key %s: seq %d after %d: in publish order", key, seq, prev)
			last[key] = seq
			where[key] = append(where[key], p)
		}
	}
	require.Len(t, where, keys)
	for key, ps := range where {
		require.Len(t, ps, perKey, key)
		require.Equal(t, []int{ps[0], ps[0], ps[0]}, ps, "every message of %s in one partition", key)
	}
}

// TestPartitionedExchangeWithoutTheHeader: what another publisher sends
// to the exchange without the header is not refused by the broker; it all
// lands in one partition — why PartitionPublisher refuses it.
func TestPartitionedExchangeWithoutTheHeader(t *testing.T) {
	t.Parallel()
	b := newPartitionedBroker(t, testenv.AMQPURL, rabbitmq.TopologyConfig{Partitions: 3})
	require.NoError(t, newPublisher(t, b.Topology().Config().Exchange).Publish("any", msgs(6)...), "routed and confirmed")
	conn := testenv.AMQP(t)
	var depths []int
	for _, part := range b.Partitions() {
		depths = append(depths, testenv.QueueDepth(t, conn, part.Endpoints().Topic))
	}
	slices.Sort(depths)
	require.Equal(t, []int{0, 0, 6}, depths, "every message without the header in one partition")
}

func TestPartitionPublisherRefuses(t *testing.T) {
	t.Parallel()
	b := newPartitionedBroker(t, testenv.AMQPURL, rabbitmq.TopologyConfig{Partitions: 2})
	pub := b.PartitionPublisher()
	err := pub.Publish(b.Topology().Config().Exchange, message.NewMessage(watermill.NewUUID(), []byte("{}")))
	require.ErrorIs(t, err, rabbitmq.ErrNoPartitionKey)
	require.ErrorIs(t, err, sluice.ErrUnpublishable)
	require.ErrorContains(t, err, partitionKey)
	require.ErrorIs(t, pub.CheckPublish(b.Topology().Config().Exchange, message.NewMessage(watermill.NewUUID(), nil)), rabbitmq.ErrNoPartitionKey)
	require.ErrorContains(t, pub.Publish("elsewhere", keyed("k", 0)), "publishes to the exchange")
	errs := pub.PublishEach(b.Topology().Config().Exchange, keyed("k", 0), message.NewMessage(watermill.NewUUID(), nil), keyed("k", 1))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], rabbitmq.ErrNoPartitionKey)
	require.NoError(t, errs[2])
}

// TestPartitionedTierReturnsToItsPartition: a copy in partition 1's tier
// expires back into partition 1, and nowhere else.
func TestPartitionedTierReturnsToItsPartition(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) {
			t.Parallel()
			b := newPartitionedBroker(t, testenv.AMQPURL, rabbitmq.TopologyConfig{Partitions: 3, TierDelays: []time.Duration{200 * time.Millisecond}, Quorum: quorum})
			parts := b.Partitions()
			e := parts[1].Endpoints()
			require.NoError(t, e.RetryPublisher.Publish(e.Tiers[0].Topic, keyed("k", 0)))
			conn := testenv.AMQP(t)
			require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, e.Topic) == 1 }, time.Minute, 20*time.Millisecond,
				"the tier's copy expires back into its partition")
			for _, p := range []int{0, 2} {
				require.Zero(t, testenv.QueueDepth(t, conn, parts[p].Endpoints().Topic))
			}
			if quorum {
				_, _, err := testenv.Channel(t, conn).Get(e.Topic, false)
				var ae *amqp.Error
				require.ErrorAs(t, err, &ae, "basic.get is refused on a quorum queue with single active consumer")
				require.Equal(t, amqp.ResourceLocked, ae.Code, ae.Reason)
			}
			ch := testenv.Channel(t, conn)
			deliveries, err := ch.Consume(e.Topic, "", true, false, false, false, nil)
			require.NoError(t, err)
			var got amqp.Delivery
			select {
			case got = <-deliveries:
			case <-time.After(time.Minute):
				t.Fatal("no delivery")
			}
			msg, err := rabbitmq.Marshaler{}.Unmarshal(got)
			require.NoError(t, err)
			require.Equal(t, e.Tiers[0].Topic, msg.Metadata.Get(metakeys.DeadLetterQueue))
		})
	}
}

// TestPartitionSingleActiveConsumer runs two instances on one partitioned
// topology, the first through a proxy: both subscribe to partition 0, and
// only the first gets its deliveries; when its connection drops (the
// instance dies) with a delivery unacked, the second receives that
// delivery again and everything after it.
func TestPartitionSingleActiveConsumer(t *testing.T) {
	t.Parallel()
	proxy, proxied := testenv.ProxyAMQP(t)
	queue := testenv.Name("sac")
	cfg := rabbitmq.TopologyConfig{Queue: queue, Partitions: 2}
	first := newPartitionedBroker(t, proxied, cfg)
	second := newPartitionedBroker(t, testenv.AMQPURL, cfg)
	conn := testenv.AMQP(t)
	p0 := first.Partitions()[0].Endpoints()

	a, err := p0.Subscriber.Subscribe(t.Context(), p0.Topic)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testenv.QueueConsumers(t, conn, p0.Topic) == 1 }, time.Minute, 20*time.Millisecond)
	sub2 := second.Partitions()[0].Endpoints()
	b, err := sub2.Subscriber.Subscribe(t.Context(), sub2.Topic)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testenv.QueueConsumers(t, conn, p0.Topic) == 2 }, time.Minute, 20*time.Millisecond)

	pub := first.Publisher()
	var held *message.Message // what the first instance leaves unacked
	receive := func(want int, holdA bool) (fromA, fromB []string) {
		t.Helper()
		deadline := time.After(time.Minute)
		for len(fromA)+len(fromB) < want {
			select {
			case m := <-a:
				fromA = append(fromA, m.Metadata.Get("seq"))
				if holdA {
					held = m
				} else {
					m.Ack()
				}
			case m := <-b:
				fromB = append(fromB, m.Metadata.Get("seq"))
				m.Ack()
			case <-deadline:
				t.Fatalf("got %v and %v of %d deliveries", fromA, fromB, want)
			}
		}
		return fromA, fromB
	}
	for seq := range 5 {
		require.NoError(t, pub.Publish(p0.Topic, keyed("k", seq)))
	}
	fromA, fromB := receive(5, false)
	require.Equal(t, []string{"0", "1", "2", "3", "4"}, fromA, "the first consumer is the active one")
	require.Empty(t, fromB)

	// One delivery the first instance holds unacked when it dies.
	require.NoError(t, pub.Publish(p0.Topic, keyed("k", 5)))
	fromA, fromB = receive(1, true)
	require.Equal(t, []string{"5"}, fromA)
	require.Empty(t, fromB)
	// The first five's acks reach the broker before the drop: only 5 is
	// unacked (on the loaded 4.0 node in make test, a drop before them had
	// the second consumer take 0–3 again).
	require.Eventually(t, func() bool {
		for line := range strings.SplitSeq(testenv.Rabbitmqctl(t, "-q", "list_queues", "--no-table-headers", "name", "messages_unacknowledged"), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == p0.Topic {
				return f[1] == "1"
			}
		}
		return false
	}, 3*time.Minute, time.Second, "only the held delivery is unacked") // a liveness bound: each rabbitmqctl starts an Erlang VM, which took tens of seconds at load average 50 (a minute was not enough on the 4.0 node)
	proxy.Reset() // the first instance's connections drop; it reconnects, as a waiting consumer
	for seq := 6; seq < 9; seq++ {
		require.NoError(t, second.Publisher().Publish(p0.Topic, keyed("k", seq)))
	}
	fromA, fromB = receive(4, false)
	require.Empty(t, fromA)
	require.Equal(t, []string{"5", "6", "7", "8"}, fromB, "the second takes over, from the delivery the first left unacked, in order")
	held.Ack() // on a connection gone: changes nothing

	require.Eventually(t, func() bool { return testenv.QueueConsumers(t, conn, p0.Topic) == 2 }, time.Minute, 50*time.Millisecond,
		"the first instance is back, waiting")
	require.NoError(t, pub.Publish(p0.Topic, keyed("k", 9)))
	fromA, fromB = receive(1, false)
	require.Empty(t, fromA)
	require.Equal(t, []string{"9"}, fromB, "the active consumer keeps the partition")
}

// TestPartitionedWithoutThePlugin declares a partitioned topology on a
// private node without rabbitmq_consistent_hash_exchange (plainNode): the
// error names the plugin and the command that enables it. The same on a
// private node with the plugin (configuredNode, testenv's Plugins)
// declares it.
func TestPartitionedWithoutThePlugin(t *testing.T) {
	t.Parallel()
	declare := func(url, queue string) error {
		b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: url},
			Topology: rabbitmq.TopologyConfig{Queue: queue, Partitions: 2, PartitionKey: partitionKey}, DepthInterval: -1})
		if err == nil {
			require.NoError(t, b.Close())
		}
		return err
	}
	t.Run("absent", func(t *testing.T) {
		t.Parallel()
		err := declare(plainNodeFor(t).URL, "orders")
		require.ErrorIs(t, err, rabbitmq.ErrConsistentHashPlugin)
		require.ErrorContains(t, err, "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange")
		require.ErrorContains(t, err, `"orders"`)
		t.Log(err)
	})
	t.Run("enabled", func(t *testing.T) {
		t.Parallel()
		node, _ := configuredNodeFor(t)
		require.NoError(t, declare(node.URL, testenv.Name("orders")))
	})
}

func TestNewTopologyValidatesPartitions(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("q", 241)
	for _, tt := range []struct {
		cfg  rabbitmq.TopologyConfig
		want string
	}{
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: -1, PartitionKey: "k"}, "TopologyConfig.Partitions -1"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 1025, PartitionKey: "k"}, "want 1 to 1024"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 4}, "TopologyConfig.PartitionKey is required"},
		{rabbitmq.TopologyConfig{Queue: "q", PartitionKey: "k"}, "without Partitions"},
		{rabbitmq.TopologyConfig{Partitions: 4, PartitionKey: "k"}, "TopologyConfig.Queue is required"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 4, PartitionKey: strings.Repeat("k", 256)}, "TopologyConfig.PartitionKey"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 4, PartitionKey: "k", ExchangeType: "topic"}, "TopologyConfig.ExchangeType"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 4, PartitionKey: "k", BindingKey: "x"}, "TopologyConfig.BindingKey"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 4, PartitionKey: "k", Exchange: "amq.x"}, "TopologyConfig.Exchange"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 4, PartitionKey: "k", PoisonQueue: "q.p2"}, "TopologyConfig.PoisonQueue"},
		{rabbitmq.TopologyConfig{Queue: "q", Partitions: 4, PartitionKey: "k", DeliveryLimit: 3}, "TopologyConfig.DeliveryLimit"},
		{rabbitmq.TopologyConfig{Queue: long, Partitions: 1000, PartitionKey: "k"}, "with 1000 partitions and these tiers it may be at most 240"},
	} {
		_, err := rabbitmq.NewTopology(tt.cfg)
		require.ErrorContains(t, err, tt.want, "%+v", tt.cfg)
	}
	_, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: long, Partitions: 1000, PartitionKey: "k"})
	require.True(t, errors.Is(err, broker.ErrNameTooLong))

	// At the limit: the longest partition's longest tier is 255 bytes.
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: long[:240], Partitions: 1000, PartitionKey: "k"})
	require.NoError(t, err)
	qs := topo.Queues()
	require.Len(t, qs, 1000*4+1)
	longest := 0
	for _, q := range qs {
		longest = max(longest, len(q.Name))
	}
	require.Equal(t, 255, longest)
}

// TestPartitionsLoweredStayBound: declaring a topology again with fewer
// partitions unbinds nothing, so the partition above the new N still
// receives its keys (docs/rabbitmq.md, "Changing N": unbind it by hand).
func TestPartitionsLoweredStayBound(t *testing.T) {
	t.Parallel()
	b := newPartitionedBroker(t, testenv.AMQPURL, rabbitmq.TopologyConfig{Partitions: 3})
	fewer, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: b.Topology().Config().Queue, Partitions: 2, PartitionKey: partitionKey})
	require.NoError(t, err)
	conn := testenv.AMQP(t)
	_, err = fewer.Declare(t.Context(), conn)
	require.NoError(t, err)
	var batch []*message.Message
	for k := range 60 {
		batch = append(batch, keyed(fmt.Sprintf("acct-%d", k), 0))
	}
	require.NoError(t, b.PartitionPublisher().Publish(b.Topology().Config().Exchange, batch...))
	require.Positive(t, testenv.QueueDepth(t, conn, b.Partitions()[2].Endpoints().Topic), "the third partition is still bound")
}
