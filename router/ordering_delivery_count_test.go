package router_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/rabbitmq"
)

// givenBack is a queue of one key's 16 events (the consumer's prefetch, all
// in flight at once) read by Orderer.Serialize over Sluice's Consumer — the
// subscriber router.Add gives an ordered handler — with the test as the
// router: it takes what Serialize hands out and acks or nacks it.
type givenBack struct {
	t      *testing.T
	q      *rabbitmq.Broker
	queue  string
	quorum bool
}

const givenBackEvents = rabbitmq.PrefetchDefault

// givenBackLimit is the queues' x-delivery-limit: Sluice's recommended
// DeliveryLimit, and RabbitMQ 4.x's default.
const givenBackLimit = 20

func newGivenBack(t *testing.T, quorum bool) *givenBack {
	t.Helper()
	queue := testenv.Name("given_back")
	var limit int
	if quorum {
		limit = givenBackLimit
	}
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, Quorum: quorum, DeliveryLimit: limit},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, q.Topology().PoisonQueue())
	t.Cleanup(func() { _ = q.Close() })
	for i := range givenBackEvents {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("a-%02d", i))
		m.Metadata.Set("account", "a")
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	return &givenBack{t: t, q: q, queue: queue, quorum: quorum}
}

// serialize starts a Consumer and a Serialize view over it; it returns the
// view and what it hands out. The view is closed when the test ends, if the
// test did not close it.
func (g *givenBack) serialize() (message.Subscriber, <-chan *message.Message) {
	g.t.Helper()
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(g.t, err)
	o, err := ordering.New(ordering.Config{Store: ordering.NewMemoryStore(), Consumer: "ledger", Key: deduplication.KeyFromMetadata("account")})
	require.NoError(g.t, err)
	sub := o.Serialize(c)
	out, err := sub.Subscribe(g.t.Context(), g.queue)
	require.NoError(g.t, err)
	g.t.Cleanup(func() { _ = sub.Close(); _ = o.Close() })
	return sub, out
}

// take returns the next delivery handed out, its event id and
// x-delivery-count; it fails the test when none comes within a minute,
// saying how many the broker dead-lettered.
func (g *givenBack) take(out <-chan *message.Message) (*message.Message, string, int) {
	g.t.Helper()
	select {
	case m := <-out:
		n, _ := strconv.Atoi(m.Metadata.Get(rabbitmq.DeliveryCountKey))
		return m, m.Metadata.Get(sluice.EventIDKey), n
	case <-time.After(time.Minute):
		g.t.Fatalf("nothing handed out in a minute; %d dead-lettered by the broker", testenv.QueueDepth(g.t, testenv.AMQP(g.t), g.q.Topology().PoisonQueue()))
		return nil, "", 0
	}
}

// allSent waits until the broker has sent every event: the ready count is
// 0, the key's deliveries are in flight, the head handed out and the rest
// waiting in Serialize.
func (g *givenBack) allSent() {
	g.t.Helper()
	conn := testenv.AMQP(g.t)
	require.Eventually(g.t, func() bool { return testenv.QueueDepth(g.t, conn, g.queue) == 0 }, time.Minute, 5*time.Millisecond)
}

// A key's deliveries given back behind its head come back in their order and
// spend no more of a quorum queue's delivery limit than the head: one return
// each per give-back. Sixteen deliveries of one key in flight (the
// Consumer's prefetch) on a classic queue and on a quorum queue with
// x-delivery-limit 20; RabbitMQ 3.x and 4.0–4.2 count every return, a
// basic.nack with requeue included.
//
//   - The head is given back 12 times (a brake engaging and disengaging
//     during a flapping outage, a key's lock that keeps timing out), then
//     every delivery is acked in its turn: the key runs a-00…a-15 in order
//     and no delivery's x-delivery-count exceeds 12, the head's.
//   - The view is closed (a shutdown) while the head runs and the other 15
//     wait; a new view over a new Consumer (the restart) runs a-01…a-15 in
//     order, each returned once — and a-00…a-15 when the head is nacked
//     in the shutdown: the waiting ones go back after it.
//
// Before, Serialize nacked the waiting deliveries all at once and the
// Consumer sent each nack from the delivery's own goroutine, in any order;
// a quorum queue redelivers in the order the returns reach it. After 12
// give-backs of a-00 the later deliveries came back at x-delivery-count
// 12–20 on RabbitMQ 4.0.5, 12–18 on 3.10.8 (Serialize gave back each that
// came out of its turn, again); in one of two runs of the same sequence on
// 4.0.5 one passed 20 and the broker dead-lettered it — a healthy message
// never handed to a handler — into the poison queue. After a restart a new
// view, which has no record of the old one's order, ran the key out of
// order (a-15 a-01 a-02 a-03 a-05 a-04 …), and a head nacked in the
// shutdown went back after the deliveries waiting behind it. (A classic
// queue puts a returned delivery back in its place and has no count: its
// subtests pass before and after.)
func TestAKeysGivenBackDeliveriesSpendNoMoreReturnsThanItsHead(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) {
			t.Parallel()
			t.Run("head given back", func(t *testing.T) {
				t.Parallel()
				const giveBacks = 12
				g := newGivenBack(t, quorum)
				sub, out := g.serialize()
				head, id, _ := g.take(out)
				require.Equal(t, "a-00", id)
				g.allSent()
				for range giveBacks {
					head.Nack()
					head, id, _ = g.take(out)
					require.Equal(t, "a-00", id, "the given-back head comes back first")
				}
				g.inOrder(out, head, 0, giveBacks)
				require.NoError(t, sub.Close())
			})
			for _, nacked := range []bool{false, true} {
				t.Run(map[bool]string{false: "restart", true: "restart, head given back"}[nacked], func(t *testing.T) {
					t.Parallel()
					g := newGivenBack(t, quorum)
					sub, out := g.serialize()
					head, id, _ := g.take(out)
					require.Equal(t, "a-00", id)
					g.allSent()
					closed := make(chan error, 1)
					go func() { closed <- sub.Close() }() // the waiting 15 are given back; the Consumer drains the head
					connected := sub.(interface{ Connected() bool })
					require.Eventually(t, func() bool { return !connected.Connected() }, time.Minute, time.Millisecond,
						"the Consumer is closing: the shutdown is under way, the head still in flight")
					from := 1
					if nacked { // its handler cancelled by the shutdown, say
						head.Nack()
						from = 0
					} else {
						head.Ack()
					}
					require.NoError(t, <-closed)

					sub, out = g.serialize()
					head, _, _ = g.take(out)
					g.inOrder(out, head, from, 1)
					require.NoError(t, sub.Close())
				})
			}
		})
	}
}

// inOrder acks head and every delivery after it, each in its turn, and
// requires events from…givenBackEvents-1 in order, none returned more than
// most times on a quorum queue (a classic queue has no count), none
// dead-lettered.
func (g *givenBack) inOrder(out <-chan *message.Message, head *message.Message, from, most int) {
	g.t.Helper()
	var got, want []string
	highest := 0
	m := head
	for i := from; i < givenBackEvents; i++ {
		if i > from {
			m, _, _ = g.take(out)
		}
		n, _ := strconv.Atoi(m.Metadata.Get(rabbitmq.DeliveryCountKey))
		got = append(got, fmt.Sprintf("%s:%d", m.Metadata.Get(sluice.EventIDKey), n))
		want = append(want, fmt.Sprintf("a-%02d", i))
		highest = max(highest, n)
		m.Ack()
	}
	g.t.Logf("handed out (event:x-delivery-count): %s", strings.Join(got, " "))
	for i := range got {
		require.Equal(g.t, want[i], strings.Split(got[i], ":")[0], "the key's order: %v", got)
	}
	require.Zero(g.t, testenv.QueueDepth(g.t, testenv.AMQP(g.t), g.q.Topology().PoisonQueue()), "dead-lettered by the broker")
	if g.quorum {
		require.LessOrEqual(g.t, highest, most, "a delivery returned more often than its key's head was given back: %v", got)
	}
}
