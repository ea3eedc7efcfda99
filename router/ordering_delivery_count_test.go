package router_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"

	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
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

// rabbitmqPrefetch is the rabbitmq package's default Prefetch
// (BrokerConfig.Prefetch), which the tests that leave it unset size by.
const rabbitmqPrefetch = 16

const givenBackEvents = rabbitmqPrefetch

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
	testenv.DeleteQueuesAtEnd(t, queueNames(q.Topology())...)
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
	o, err := ordering.New(ordering.Config{Store: ordering.NewMemoryStore(), Consumer: "ledger", Key: sluice.KeyFromMetadata("account")})
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
		n, _ := strconv.Atoi(m.Metadata.Get(metakeys.DeliveryCount))
		return m, m.Metadata.Get(sluice.EventIDKey), n
	case <-time.After(time.Minute):
		g.t.Fatalf("nothing handed out in a minute; %d dead-lettered by the broker", testenv.QueueDepth(g.t, testenv.AMQP(g.t), g.q.Topology().Config().PoisonQueue))
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
		n, _ := strconv.Atoi(m.Metadata.Get(metakeys.DeliveryCount))
		got = append(got, fmt.Sprintf("%s:%d", m.Metadata.Get(sluice.EventIDKey), n))
		want = append(want, fmt.Sprintf("a-%02d", i))
		highest = max(highest, n)
		m.Ack()
	}
	g.t.Logf("handed out (event:x-delivery-count): %s", strings.Join(got, " "))
	for i := range got {
		require.Equal(g.t, want[i], strings.Split(got[i], ":")[0], "the key's order: %v", got)
	}
	require.Zero(g.t, testenv.QueueDepth(g.t, testenv.AMQP(g.t), g.q.Topology().Config().PoisonQueue), "dead-lettered by the broker")
	if g.quorum {
		require.LessOrEqual(g.t, highest, most, "a delivery returned more often than its key's head was given back: %v", got)
	}
}

// An ordered key keeps its order across restarts mid-load, end to end: a
// handler added by router.Add with Stages.Order (and the inbox) on a
// classic queue and on a quorum queue with x-delivery-limit 20, one key's
// 64 events; three times the router is closed while the key's first
// delivery of the run is in its handler and the 15 after it wait in the
// ordered view (the Consumer's prefetch, 16, all sent), then started anew
// (a deploy). The key applies 0…63 in order, each once, the broker
// dead-letters nothing, and no delivery comes back more often than the
// restarts it waited through (x-delivery-count ≤ 3). Before, the view gave
// back the waiting deliveries in any order, a quorum queue redelivered them
// in that order, and the next run applied them out of order (0 14 2 15 17
// 16 12 11 10 13 8 9 5 4 7 6 1 3 18 … on RabbitMQ 3.10.8). Router.Close
// cancels the subscription's context at once, which ends every delivery's
// context: Serialize waits for the Consumer's own signal that a nack is
// sent (internal/settle), not for the context.
func TestAnOrderedKeyKeepsItsOrderAcrossRestartsMidLoad(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) {
			t.Parallel()
			const events, restarts = 64, 3
			db, schema, inbox, orders := newOrderedStores(t, "seq int NOT NULL")
			applied := func() []int {
				var seqs []int
				require.NoError(t, db.Select(&seqs, fmt.Sprintf(`SELECT seq FROM %s.applied ORDER BY n`, schema)))
				return seqs
			}

			queue := testenv.Name("restarted")
			tc := rabbitmq.TopologyConfig{Queue: queue, Quorum: quorum}
			if quorum {
				tc.DeliveryLimit = givenBackLimit
			}
			newBroker := func(logger watermill.LoggerAdapter) *rabbitmq.Broker {
				b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL, Logger: logger}, Topology: tc})
				require.NoError(t, err)
				t.Cleanup(func() { _ = b.Close() })
				return b
			}
			b := newBroker(nil)
			testenv.DeleteQueuesAtEnd(t, queueNames(b.Topology())...)
			for seq := range events {
				m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("a-%02d", seq))
				m.Metadata.Set("account", "a")
				m.Metadata.Set("seq", fmt.Sprint(seq))
				require.NoError(t, b.Publisher().Publish(queue, m))
			}
			conn := testenv.AMQP(t)
			var most atomic.Int64 // the highest x-delivery-count a handler saw
			for run := range restarts + 1 {
				logger := testenv.NewClosingLogger()
				require.NoError(t, b.Close()) // the last run's (the first's: the publisher's)
				b = newBroker(logger)
				r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger)
				require.NoError(t, err)
				held, release := make(chan struct{}), make(chan struct{})
				var first atomic.Bool
				_, err = router.Add(r, router.HandlerConfig{
					Broker: b, Name: "ledger",
					Handler: func(msg *message.Message) error {
						n, _ := strconv.Atoi(msg.Metadata.Get(metakeys.DeliveryCount))
						for m := most.Load(); int64(n) > m && !most.CompareAndSwap(m, int64(n)); m = most.Load() {
						}
						if run < restarts && first.CompareAndSwap(false, true) {
							close(held)
							<-release
						}
						_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
							fmt.Sprintf(`INSERT INTO %s.applied (seq) VALUES ($1)`, schema), msg.Metadata.Get("seq"))
						return err
					},
					Stages: router.Stages{
						Order: &ordering.Config{Store: orders, Key: sluice.KeyFromMetadata("account")},
						Inbox: &deduplication.Config{Store: inbox},
					},
				})
				require.NoError(t, err)
				done := testenv.RunRouter(context.Background(), r)
				if run == restarts {
					if err := testenv.AwaitCount(events, 2*time.Minute, 10*time.Minute, func() int { return min(len(applied()), events) }); err != nil {
						t.Fatalf("every event applied after %d restarts: %v; %s", restarts, err, testenv.QueueDepths(t, conn, queue, b.Topology().Config().PoisonQueue))
					}
					require.NoError(t, r.Close())
					require.NoError(t, <-done)
					break
				}
				<-held
				remaining := events - len(applied())
				require.Greater(t, remaining, rabbitmqPrefetch)
				require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == remaining-rabbitmqPrefetch },
					time.Minute, 5*time.Millisecond, "the key's head in its handler, the next 15 sent and waiting")
				closed := make(chan error, 1)
				go func() { closed <- r.Close() }() // the deploy: the router closes with the head in its handler
				select {                            // the Consumer has cancelled: the head's ack frees no credit
				case <-logger.Draining:
				case <-time.After(time.Minute):
					close(release)
					t.Fatal("the Consumer did not cancel within a minute of the router's Close")
				}
				close(release)
				require.NoError(t, <-closed)
				require.NoError(t, <-done)
			}
			got := applied()
			t.Logf("applied %d events after %d restarts mid-load; the highest x-delivery-count a handler saw: %d", len(got), restarts, most.Load())
			want := make([]int, events)
			for i := range want {
				want[i] = i
			}
			require.Equal(t, want, got, "the key's order, each once")
			require.Zero(t, testenv.QueueDepth(t, conn, b.Topology().Config().PoisonQueue), "dead-lettered by the broker")
			if quorum {
				require.LessOrEqual(t, most.Load(), int64(restarts), "a delivery returned once per restart at most")
			}
		})
	}
}

// newOrderedStores returns the test database, a schema of t's own holding
// an applied table (n bigserial, then column), the inbox store and the
// ordering store in it.
func newOrderedStores(t *testing.T, column string) (*sqlx.DB, string, *sluicesql.Inbox, ordering.Store) {
	t.Helper()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s.applied (n bigserial PRIMARY KEY, %s)`, schema, column))
	require.NoError(t, err)
	inbox := testenv.SQLStore(t, db, schema+".inbox")
	orders := testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Order: sluicesql.OrdersConfig{TablePrefix: "order"}}).Order
	return db, schema, inbox, orders
}
