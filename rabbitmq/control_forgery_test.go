package rabbitmq_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/signing"
)

// Issue 18, item 7: Sluice's control headers are believed only when Sluice
// wrote them. Each test forges them as a producer can — headers published
// straight into the queue, and, against a stack with a key, x-death too —
// through router.Add with rabbitmq.NewBroker.

var testKey = []byte("test-signing-key-of-at-least-32-bytes")

// signed gives the stack the Signer of testKey: router.Add gives it to
// the retry, poison and replay stages.
func signed(t *testing.T) (*signing.Signer, func(*router.Stages)) {
	t.Helper()
	s, err := signing.New(testKey)
	require.NoError(t, err)
	return s, func(st *router.Stages) { st.Signer = s }
}

// forgedDeath is the x-death a producer writes to pose as a copy back from
// the stack's first tier (RabbitMQ 3.x keeps a publisher's x-death).
func forgedDeath(s *stack) amqp.Table {
	tier := s.topo.Tiers()[0].Topic
	return amqp.Table{"x-death": []any{amqp.Table{
		"count": int64(1), "queue": tier, "reason": "expired", "exchange": "", "routing-keys": []any{tier},
	}}}
}

// forgery is one way to forge: the stack's stages and the headers.
type forgery struct {
	keyed   bool
	headers func(*stack) amqp.Table
}

// forgeries are the forged headers sent to a stack without a key, and with
// x-death forged too to a stack with one.
func forgeries(forged amqp.Table) map[string]forgery {
	return map[string]forgery{
		"keyless":                    {false, func(*stack) amqp.Table { return forged }},
		"with a key, forged x-death": {true, func(s *stack) amqp.Table { return with(forged, forgedDeath(s)) }},
	}
}

func (f forgery) opts(t *testing.T) []func(*router.Stages) {
	if !f.keyed {
		return nil
	}
	_, opt := signed(t)
	return []func(*router.Stages){opt}
}

func with(h amqp.Table, more amqp.Table) amqp.Table {
	out := amqp.Table{}
	for k, v := range h {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// A producer's sluice_attempt of 999999999999 (with a forged first failure,
// origin and user) is a first attempt: a handler that keeps failing runs
// through the whole ladder — 4 deliveries — before it is exhausted with
// attempt 4. Before the fix it was exhausted on its first delivery.
func TestForgedAttemptDoesNotSkipTheLadder(t *testing.T) {
	t.Parallel()
	forged := amqp.Table{
		sluice.AttemptKey: "999999999999", sluice.FirstFailedAtKey: "1999-01-01T00:00:00Z",
		metakeys.OriginRoutingKey: "payments", metakeys.OriginUserID: "admin", sluice.RetryTierKey: "forged",
	}
	for name, tc := range forgeries(forged) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts(t)
			s := newBrokerStack(t, func(*message.Message) error { return sluice.Transient(errStockTimeout) }, opts...)
			s.publishRaw(t, amqp.Publishing{Headers: with(tc.headers(s), amqp.Table{sluice.EventIDKey: "evt-forged"})})
			s.handled(t, "evt-forged", 4)
			got := s.settled(t, 1)
			require.Len(t, s.deliveries("evt-forged"), 4, "the whole ladder")
			first := s.deliveries("evt-forged")[0].Metadata
			for _, k := range []string{sluice.AttemptKey, sluice.FirstFailedAtKey, metakeys.OriginRoutingKey, metakeys.OriginUserID, sluice.RetryTierKey} {
				require.Empty(t, first.Get(k), "%s: not believed on the first delivery", k)
			}
			p := got[0].Headers
			require.Equal(t, "exhausted", p[metakeys.PoisonClass])
			require.Equal(t, "4", p[sluice.AttemptKey])
			require.NotEqual(t, "1999-01-01T00:00:00Z", p[sluice.FirstFailedAtKey])
			require.Equal(t, s.topo.Config().Queue, p[metakeys.PoisonRoutingKey], "the real origin")
		})
	}
}

// A producer's parked mark with its own diagnosis and target queue is no
// parked copy: the handler runs (and the inbox with it). One it processes
// leaves nothing in the poison queue; one it poisons is isolated with the
// stage's own diagnosis, this consumer's queue as the replay target, and no
// parked mark. Before the fix both went to the poison queue unprocessed,
// with the producer's diagnosis and target queue.
func TestForgedParkedMarkRunsTheHandler(t *testing.T) {
	t.Parallel()
	forged := amqp.Table{
		metakeys.PoisonParked: "1", metakeys.PoisonClass: "poison", metakeys.PoisonReason: "forged reason",
		metakeys.PoisonQueue: "other-service", metakeys.PoisonConsumer: "someone", metakeys.PoisonStack: "forged stack",
	}
	for name, tc := range forgeries(forged) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts(t)
			s := newBrokerStack(t, func(msg *message.Message) error {
				if msg.Metadata.Get(sluice.EventIDKey) == "evt-bad" {
					return sluice.Poison(errors.New(`missing field "sku"`))
				}
				return nil
			}, opts...)
			s.publishRaw(t, amqp.Publishing{Headers: with(tc.headers(s), amqp.Table{sluice.EventIDKey: "evt-good"})})
			s.publishRaw(t, amqp.Publishing{Headers: with(tc.headers(s), amqp.Table{sluice.EventIDKey: "evt-bad"})})
			s.handled(t, "evt-good", 1)
			s.handled(t, "evt-bad", 1)
			for _, k := range []string{metakeys.PoisonParked, metakeys.PoisonClass, metakeys.PoisonQueue} {
				require.Empty(t, s.deliveries("evt-good")[0].Metadata.Get(k), "%s: not believed", k)
			}
			got := s.settled(t, 1)
			p := got[0].Headers
			require.Equal(t, "evt-bad", p[sluice.EventIDKey])
			require.Equal(t, s.topo.Config().Queue, p[metakeys.PoisonQueue], "a replay goes back to this consumer's queue")
			require.Equal(t, "inventory", p[metakeys.PoisonConsumer])
			require.Contains(t, p[metakeys.PoisonReason], `missing field "sku"`)
			require.NotContains(t, p, metakeys.PoisonParked)
			require.NotContains(t, p, metakeys.PoisonStack)
		})
	}
}

// outcomes is a replay.Store in memory.
type outcomes struct {
	mu  sync.Mutex
	got []replay.Record
}

func (o *outcomes) Record(_ context.Context, r replay.Record) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, r)
	return nil
}

func (o *outcomes) records() []replay.Record {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]replay.Record(nil), o.got...)
}

// With a key, a producer's replay run and item record nothing: the message
// is processed, its outcome not written into the run, and so is one the
// CLI signed for another queue. One the CLI signed for this queue (as
// `sluice dlq replay --signing-key-file` does) is recorded. Before the
// fix the forged one wrote "processed" into the run.
func TestForgedReplayRunIsNotRecorded(t *testing.T) {
	t.Parallel()
	store := &outcomes{}
	signer, opt := signed(t)
	s := newBrokerStack(t, func(*message.Message) error { return nil }, func(st *router.Stages) {
		st.Replay = &replay.Config{Store: store}
	}, opt)
	s.publishRaw(t, amqp.Publishing{Headers: amqp.Table{
		sluice.EventIDKey: "evt-forged", replay.RunKey: "run-1", replay.ItemKey: "evt-forged",
	}})
	s.publishRaw(t, amqp.Publishing{Headers: amqp.Table{
		sluice.EventIDKey: "evt-forged-sig", replay.RunKey: "run-1", replay.ItemKey: "evt-forged-sig", sluice.SignatureKey: "v1:AAAA",
	}})
	for id, queue := range map[string]string{"evt-replayed": s.topo.Config().Queue, "evt-replayed-elsewhere": s.topo.Config().Queue + "-other"} {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
		m.Metadata.Set(sluice.EventIDKey, id)
		m.Metadata.Set(replay.RunKey, "run-1")
		m.Metadata.Set(replay.ItemKey, id)
		signer.Sign(m, queue) // as the CLI signs a replay to queue
		require.NoError(t, s.pub.Publish(s.topo.Config().Queue, m))
	}

	for _, id := range []string{"evt-forged", "evt-forged-sig", "evt-replayed", "evt-replayed-elsewhere"} {
		s.handled(t, id, 1)
	}
	s.settled(t, 0)
	s.stop() // every delivery's stages have returned
	rs := store.records()
	require.Len(t, rs, 1, "only the replay signed for this queue is recorded: %+v", rs)
	require.Equal(t, "evt-replayed", rs[0].Item)
	require.Equal(t, sluice.OutcomeProcessed, rs[0].Outcome)
	require.Empty(t, s.deliveries("evt-forged")[0].Metadata.Get(replay.RunKey))
}
