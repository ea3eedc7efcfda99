package router_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
)

// seen is one delivery as it reached the router, and what became of it.
type seen struct {
	uuid, attempt, redelivered, from string
	outcome                          sluice.Outcome
	err                              error
}

// observe records every delivery the router hands to a handler — the ones
// the inbox skips included — with its outcome, on out.
func observe(out chan<- seen) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			s := seen{uuid: msg.UUID, attempt: msg.Metadata.Get(sluice.AttemptKey),
				redelivered: msg.Metadata.Get(rabbitmq.RedeliveredKey), from: msg.Metadata.Get(sluice.DeadLetterQueueKey)}
			ctx, rep := sluice.WithReport(msg.Context())
			msg.SetContext(ctx)
			produced, err := h(msg)
			s.outcome, s.err = rep.Outcome, err
			out <- s
			return produced, err
		}
	}
}

// next returns the next delivery seen, within 15 s.
func next(t *testing.T, ch <-chan seen) seen {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(15 * time.Second):
		require.FailNow(t, "no delivery within 15s")
		return seen{}
	}
}

// copiesPublisher is a confirmed publisher for the stages' copies that
// reaches the broker through a proxy the test controls; it is connected
// (a first message confirmed) before it returns.
func copiesPublisher(t *testing.T) (*rabbitmq.Publisher, *testenv.Proxy) {
	t.Helper()
	proxy, url := testenv.ProxyAMQP(t)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{URL: url, ConfirmTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Heal(); _ = pub.Close() })
	var ue *rabbitmq.UnroutableError
	require.ErrorAs(t, pub.Publish(testenv.Name("nowhere"), message.NewMessage(watermill.NewUUID(), nil)), &ue, "connected")
	return pub, proxy
}

// A failing delivery whose retry copy reached its tier but whose confirm was
// lost (a proxy in front of the broker drops the publisher's replies) makes
// one copy chain: no copy in another tier, the original nacked and
// redelivered, one effect in the end. Before ErrPublishUncertain the stage
// took the lost confirm for a refusal and parked a second copy in the next
// tier: two retry chains for one delivery.
func TestLostConfirmMakesOneRetryChain(t *testing.T) {
	t.Parallel()
	db, schema, store := inbox(t)
	queue := testenv.Name("lost_confirm")
	q := newRabbitMQ(t, queue, 2*time.Second, time.Minute)
	tier1, tier2 := q.Topology().Tiers()[0].Topic, q.Topology().Tiers()[1].Topic
	pub, proxy := copiesPublisher(t)

	deliveries := make(chan seen, 16)
	first, failFirst := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(observe(deliveries))
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "lost_confirm",
		Handler: func(msg *message.Message) error {
			if calls.Add(1) == 1 {
				close(first)
				<-failFirst
				return sluice.Transient(errors.New("stock service: connection refused"))
			}
			_, err := sqlstore.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), msg.Metadata.Get(sluice.EventIDKey))
			return err
		},
		Stages: router.Stages{
			Poison:    &poison.Config{Publisher: pub, ParkPublisher: pub, PublishBackoff: 10 * time.Millisecond},
			Retry:     &retrytiers.Config{Publisher: pub, PublishBackoff: 10 * time.Millisecond},
			Classify:  &middleware.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: store, Consumer: "lost_confirm"},
			Recoverer: &middleware.RecovererConfig{},
		},
	})
	require.NoError(t, err)
	runRouter(t, r)

	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-lost-confirm")
	require.NoError(t, q.Publisher().Publish(queue, m))
	select {
	case <-first:
	case <-time.After(15 * time.Second):
		require.FailNow(t, "the delivery never reached the handler")
	}
	proxy.DropReplies() // the retry copy will reach its tier; its confirm will not come back
	close(failFirst)

	d := next(t, deliveries)
	require.Equal(t, m.UUID, d.uuid)
	require.ErrorIs(t, d.err, sluice.ErrPublishUncertain, "nacked after the uncertain publish")
	require.Equal(t, sluice.Outcome(""), d.outcome, "not recorded as retried")

	// The redelivered original and the copy stored in the first tier come
	// back, in either order: one runs the handler, the inbox skips the other.
	var original, copies []seen
	for len(original) == 0 || len(copies) == 0 {
		d := next(t, deliveries)
		require.NoError(t, d.err)
		if d.from == "" {
			original = append(original, d)
		} else {
			copies = append(copies, d)
		}
	}
	require.Equal(t, "true", original[0].redelivered, "the original was nacked and redelivered")
	require.Equal(t, m.UUID, original[0].uuid)
	require.Equal(t, tier1, copies[0].from, "the one copy waited in the first tier")
	require.Equal(t, "2", copies[0].attempt)
	require.ElementsMatch(t, []sluice.Outcome{"", sluice.OutcomeDuplicate}, // "": processed (no Trace stage records it)
		[]sluice.Outcome{original[0].outcome, copies[0].outcome}, "one ran the handler, the inbox skipped the other")

	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, tier2), "no copy in a second tier: one retry chain")
	require.Zero(t, testenv.QueueDepth(t, conn, tier1))
	require.Zero(t, testenv.QueueDepth(t, conn, q.Topology().PoisonQueue()))
	var effects int
	require.NoError(t, db.Get(&effects, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
	require.Equal(t, 1, effects, "one effect")
	select {
	case d := <-deliveries:
		require.FailNow(t, "a delivery more", "%+v", d)
	default:
	}
}

// A poison delivery whose poison copy reached the poison queue but whose
// confirm was lost is not parked as well: the original is nacked and
// redelivered, and no copy waits in the park topic (the first tier) to come
// back as another poison entry. Before ErrPublishUncertain the stage took
// the lost confirm for a refusal and parked a second diagnosed copy.
func TestLostPoisonConfirmIsNotParked(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("lost_poison_confirm")
	q := newRabbitMQ(t, queue, time.Minute)
	pub, proxy := copiesPublisher(t)

	deliveries := make(chan seen, 16)
	first, failFirst, healed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(observe(deliveries))
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "lost_poison_confirm",
		Handler: func(msg *message.Message) error {
			switch calls.Add(1) {
			case 1:
				close(first)
				<-failFirst
			case 2:
				<-healed
			}
			return sluice.Poison(errors.New("unknown version 7"))
		},
		Stages: router.Stages{
			Poison:   &poison.Config{Publisher: pub, ParkPublisher: pub, PublishBackoff: 10 * time.Millisecond},
			Retry:    &retrytiers.Config{Publisher: pub, PublishBackoff: 10 * time.Millisecond},
			Classify: &middleware.ClassifyConfig{},
		},
	})
	require.NoError(t, err)
	runRouter(t, r)

	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-lost-poison-confirm")
	require.NoError(t, q.Publisher().Publish(queue, m))
	select {
	case <-first:
	case <-time.After(15 * time.Second):
		require.FailNow(t, "the delivery never reached the handler")
	}
	proxy.DropReplies() // the poison copy will reach the poison queue; its confirm will not come back
	close(failFirst)

	d := next(t, deliveries)
	require.ErrorIs(t, d.err, sluice.ErrPublishUncertain, "nacked after the uncertain publish")
	require.NotEqual(t, sluice.OutcomeParked, d.outcome)
	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, q.Topology().Tiers()[0].Topic), "no second copy parked")

	// Heal the publisher's route (its connection is reset; it reconnects on
	// a publish) and let the redelivery be isolated.
	proxy.Heal()
	require.Eventually(t, func() bool {
		var ue *rabbitmq.UnroutableError
		return errors.As(pub.Publish(testenv.Name("nowhere"), message.NewMessage(watermill.NewUUID(), nil)), &ue)
	}, 15*time.Second, 10*time.Millisecond, "the publisher reconnected")
	close(healed)
	d = next(t, deliveries)
	require.NoError(t, d.err)
	require.Equal(t, "true", d.redelivered, "the original was nacked and redelivered")
	require.Equal(t, sluice.OutcomePoisoned, d.outcome)

	require.Zero(t, testenv.QueueDepth(t, conn, q.Topology().Tiers()[0].Topic), "nothing parked")
	entries := testenv.Drain(t, conn, q.Topology().PoisonQueue())
	require.Len(t, entries, 2, "the copy whose confirm was lost, and the redelivery's")
	for _, e := range entries {
		require.Equal(t, "evt-lost-poison-confirm", e.Headers[sluice.EventIDKey])
	}
}
