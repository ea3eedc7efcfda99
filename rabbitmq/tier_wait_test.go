package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
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
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// RabbitMQ expires messages at the head of a queue only: a message with a
// per-message expiration shorter than the one ahead of it is dead-lettered
// when the head is, not before — on classic and quorum queues alike. So a
// tier cannot jitter by message within its queue (a burst would come back at
// its latest time); broker.Jittered gives each wait a queue of its own.
func TestAShorterExpirationWaitsForTheHead(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		t.Run(fmt.Sprintf("quorum=%v", quorum), func(t *testing.T) {
			t.Parallel()
			back, tier := testenv.Name("head_back"), testenv.Name("head_tier")
			testenv.DeleteQueuesAtEnd(t, back, tier)
			conn := testenv.AMQP(t)
			ch := testenv.Channel(t, conn)
			args := amqp.Table{"x-message-ttl": int64(1500), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": back}
			if quorum {
				args["x-queue-type"] = "quorum"
			}
			_, err := ch.QueueDeclare(back, true, false, false, false, nil)
			require.NoError(t, err)
			_, err = ch.QueueDeclare(tier, true, false, false, false, args)
			require.NoError(t, err)
			start := time.Now()
			for _, p := range []amqp.Publishing{
				{MessageId: "head", Body: []byte("1.5 s, the queue's TTL")},
				{MessageId: "behind", Body: []byte("50 ms, its own"), Expiration: "50"},
			} {
				require.NoError(t, ch.PublishWithContext(t.Context(), "", tier, true, false, p))
			}
			var order []string
			var behind time.Duration
			require.Eventually(t, func() bool {
				d, ok, err := ch.Get(back, true)
				require.NoError(t, err)
				if ok {
					order = append(order, d.MessageId)
					if d.MessageId == "behind" {
						behind = time.Since(start)
					}
				}
				return len(order) == 2
			}, time.Minute, 10*time.Millisecond)
			require.Equal(t, []string{"head", "behind"}, order, "the 50 ms message left the tier after the head")
			t.Logf("the 50 ms message came back after %s", behind.Round(10*time.Millisecond))
		})
	}
}

// waitStack runs the retry and poison stages through router.Add on
// rabbitmq.NewBroker with topology cfg; each delivery the handler sees is
// recorded with the time it was handed over.
type waitStack struct {
	topo *rabbitmq.Topology
	mu   sync.Mutex
	seen map[string][]seenDelivery // by message id
}

type seenDelivery struct {
	at                  time.Time
	attempt, from, tier string
}

func newWaitStack(t *testing.T, cfg rabbitmq.TopologyConfig, handler func(attempt string) error) *waitStack {
	t.Helper()
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: cfg})
	require.NoError(t, err)
	names := []string{b.Topology().Config().Queue, b.Topology().Config().PoisonQueue}
	for _, d := range b.Topology().Plan().Queues {
		names = append(names, d.Name)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	s := &waitStack{topo: b.Topology(), seen: map[string][]seenDelivery{}}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b, Name: "waits", Consumers: 1,
		Stages: router.Stages{
			Poison:   &poison.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
			Retry:    &retrytiers.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
			Classify: &stage.ClassifyConfig{},
		},
		Handler: func(msg *message.Message) error {
			attempt := msg.Metadata.Get(sluice.AttemptKey)
			s.mu.Lock()
			id := msg.Metadata.Get(metakeys.PropertyMessageID)
			s.seen[id] = append(s.seen[id], seenDelivery{time.Now(), attempt, msg.Metadata.Get(metakeys.DeadLetterQueue), msg.Metadata.Get(sluice.RetryTierKey)})
			s.mu.Unlock()
			return handler(attempt)
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
		require.NoError(t, b.Close())
	})
	return s
}

// publish publishes n messages, with message ids 0 to n-1, into the queue.
func (s *waitStack) publish(t *testing.T, n int) {
	t.Helper()
	ch := testenv.Channel(t, testenv.AMQP(t))
	for i := range n {
		require.NoError(t, ch.PublishWithContext(t.Context(), "", s.topo.Config().Queue, true, false,
			amqp.Publishing{MessageId: fmt.Sprint(i), Body: []byte("{}"), DeliveryMode: amqp.Persistent}))
	}
}

// deliveries returns, once every one of n messages was seen k times, what
// was seen of each. The messages seen k times are counted while they come:
// a loaded machine takes its time over a burst.
func (s *waitStack) deliveries(t *testing.T, n, k int) map[string][]seenDelivery {
	t.Helper()
	require.NoError(t, testenv.AwaitCount(n, time.Minute, 10*time.Minute, func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		done := 0
		for i := range n {
			if len(s.seen[fmt.Sprint(i)]) >= k {
				done++
			}
		}
		return done
	}), "each of %d messages seen %d times", n, k)
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps(s.seen)
}

func maps(m map[string][]seenDelivery) map[string][]seenDelivery {
	out := make(map[string][]seenDelivery, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}

// A burst of failures in a jittered tier comes back in waves: each copy
// waits in one of the tier's four queues (6 s, 5 s, 4 s, 3 s), every queue
// is used, and no copy comes back before its queue's TTL. Without jitter the
// burst comes back as it left. The waves' times are logged
// (docs/retry-tiers.md quotes them).
func TestAJitteredTierSpreadsABurst(t *testing.T) {
	t.Parallel()
	for name, jitter := range map[string]broker.Jitter{"jittered": {Fraction: 0.5, Queues: 4}, "one queue": {}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spread := burst(t, jitter)
			if jitter.Fraction > 0 {
				require.Len(t, spread, 4, "every queue of the tier took copies")
			}
		})
	}
}

// clockSkew is how far the broker's clock (which times a queue's TTL) and
// the test's may disagree over a few seconds on a loaded machine.
const clockSkew = 50 * time.Millisecond

// burst fails 80 messages once into a 6 s tier jittered by j and returns
// the waits of the copies by the queue they waited in.
func burst(t *testing.T, j broker.Jitter) map[string][]time.Duration {
	const n = 80
	s := newWaitStack(t, rabbitmq.TopologyConfig{Queue: testenv.Name("jitter"), TierDelays: []time.Duration{6 * time.Second}, TierJitter: j},
		func(attempt string) error {
			if attempt == "" {
				return sluice.Transient(errors.New("the dependency is down"))
			}
			return nil
		})
	tier := s.topo.Tiers()[0]
	waits := map[string]time.Duration{tier.Topic: tier.Delay}
	for _, w := range tier.Waits {
		waits[w.Topic] = w.Delay
	}
	s.publish(t, n)
	seen := s.deliveries(t, n, 2)
	byWait := map[string][]time.Duration{}
	var failed, back []time.Time
	for id, ds := range seen {
		require.Len(t, ds, 2, "message %s: failed once, then handled", id)
		delay, ok := waits[ds[1].from]
		require.True(t, ok, "message %s came back from %q, one of the tier's queues", id, ds[1].from)
		require.Equal(t, "6s", ds[1].tier)
		waited := ds[1].at.Sub(ds[0].at)
		// RabbitMQ times a TTL on the OS wall clock, this test on Go's
		// monotonic one; under load they disagreed by up to 17 ms in CI.
		require.GreaterOrEqual(t, waited, delay-clockSkew, "message %s came back before its queue's TTL", id)
		byWait[ds[1].from] = append(byWait[ds[1].from], waited)
		failed, back = append(failed, ds[0].at), append(back, ds[1].at)
	}
	for topic, ws := range byWait {
		slices.Sort(ws)
		t.Logf("%s (TTL %s): %d copies, waited %s to %s", topic, waits[topic], len(ws), ws[0].Round(10*time.Millisecond), ws[len(ws)-1].Round(10*time.Millisecond))
	}
	span := func(ts []time.Time) time.Duration {
		return slices.MaxFunc(ts, time.Time.Compare).Sub(slices.MinFunc(ts, time.Time.Compare))
	}
	t.Logf("the %d failures happened over %s; their copies came back over %s", n, span(failed).Round(10*time.Millisecond), span(back).Round(10*time.Millisecond))
	return byWait
}

// A failure that says when to come back (sluice.RetryAfter, 700 ms) skips
// the tiers that wait less (200 ms, 500 ms) for the 1 s one, and its attempt
// counts them: the next failure spends the budget and goes to the poison
// queue as exhausted after 4 attempts.
func TestRetryAfterOnTheBroker(t *testing.T) {
	t.Parallel()
	s := newWaitStack(t, rabbitmq.TopologyConfig{Queue: testenv.Name("retry_after"),
		TierDelays: []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second}}, func(attempt string) error {
		if attempt == "" {
			return sluice.RetryAfter(errors.New("429 Too Many Requests"), 700*time.Millisecond)
		}
		return sluice.Transient(errors.New("still limited"))
	})
	s.publish(t, 1)
	ds := s.deliveries(t, 1, 2)["0"]
	require.Equal(t, s.topo.Tiers()[2].Topic, ds[1].from, "back from the 1s tier")
	require.Equal(t, "4", ds[1].attempt, "the two tiers skipped are spent")
	require.GreaterOrEqual(t, ds[1].at.Sub(ds[0].at), 700*time.Millisecond)
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, s.topo.Config().PoisonQueue) == 1 }, time.Minute, 20*time.Millisecond)
	got := testenv.Drain(t, conn, s.topo.Config().PoisonQueue)
	require.Equal(t, "exhausted", got[0].Headers[metakeys.PoisonClass])
	require.Equal(t, "4", got[0].Headers[sluice.AttemptKey])
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.seen["0"], 2, "no tier after the budget")
}
