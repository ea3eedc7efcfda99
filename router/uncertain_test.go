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
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// seen is one delivery as it reached the router, and what became of it.
type seen struct {
	uuid, copyID, attempt, redelivered, from string
	outcome                                  sluice.Outcome
	err                                      error
}

// observe records every delivery the router hands to a handler — the ones
// the inbox skips included — with its outcome, on out.
func observe(out chan<- seen) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			s := seen{uuid: msg.UUID, copyID: msg.Metadata.Get(sluice.CopyIDKey), attempt: msg.Metadata.Get(sluice.AttemptKey),
				redelivered: msg.Metadata.Get(metakeys.Redelivered), from: msg.Metadata.Get(metakeys.DeadLetterQueue)}
			ctx, rep := sluice.WithReport(msg.Context())
			msg.SetContext(ctx)
			produced, err := h(msg)
			s.outcome, s.err = rep.Outcome, err
			out <- s
			return produced, err
		}
	}
}

// lostConfirm is a handler on a queue of its own (router.Add +
// rabbitmq.NewBroker) whose stages publish their copies through a proxy the
// test controls.
type lostConfirm struct {
	q          *rabbitmq.Broker
	pub        *rabbitmq.Publisher
	proxy      *testenv.Proxy
	deliveries chan seen
	event      *message.Message
}

// startLostConfirm adds handle (given the delivery's number, from 1) with
// the stages stages gives for the copies' publisher, publishes one event,
// and once the handler holds the first delivery drops the proxy's replies:
// the copy that delivery makes reaches the broker, its confirm does not
// come back.
func startLostConfirm(t *testing.T, name string, stages func(pub message.Publisher) router.Stages,
	handle func(n int64, msg *message.Message) error, delays ...time.Duration) *lostConfirm {
	t.Helper()
	b := &lostConfirm{q: newRabbitMQ(t, testenv.Name(name), delays...), deliveries: make(chan seen, 16)}
	b.proxy, b.pub = copiesPublisher(t)
	first, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(observe(b.deliveries))
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b.q, Name: name,
		Handler: func(msg *message.Message) error {
			n := calls.Add(1)
			if n == 1 {
				close(first)
				<-release
			}
			return handle(n, msg)
		},
		Stages: stages(b.pub),
	})
	require.NoError(t, err)
	runRouter(t, r)

	b.event = message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	b.event.Metadata.Set(sluice.EventIDKey, "evt-"+name)
	require.NoError(t, b.q.Publisher().Publish(b.q.Topology().Config().Queue, b.event))
	await(t, first, "the delivery never reached the handler")
	b.proxy.DropReplies()
	close(release)
	return b
}

// copyTier is the first tier of the tests that lose a copy's confirm.
const copyTier = 4 * time.Second

// copiesPublisher is a confirmed publisher for the stages' copies that
// reaches the broker through a proxy; it is connected (a first publish
// answered) before it returns. Its confirm timeout is what a lost confirm
// costs a test (at 200 ms, a confirm after the heal outlived it at a load
// of 31 in make test); the tests' first tier waits longer (copyTier), so
// that the copy whose confirm was lost comes back after the original's
// nack.
func copiesPublisher(t *testing.T) (*testenv.Proxy, *rabbitmq.Publisher) {
	t.Helper()
	proxy, url := testenv.ProxyAMQP(t)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url}, ConfirmTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Heal(); _ = pub.Close() })
	requireUnroutable(t, pub)
	return proxy, pub
}

// requireUnroutable publishes to a queue that does not exist and requires
// the broker's answer: a mandatory return.
func requireUnroutable(t *testing.T, pub *rabbitmq.Publisher) {
	t.Helper()
	var ue *rabbitmq.UnroutableError
	require.ErrorAs(t, pub.Publish(testenv.Name("nowhere"), message.NewMessage(watermill.NewUUID(), nil)), &ue)
}

// heal ends the proxy's fault and waits until the publisher is answered
// through it again (its connection was reset; it reconnects on a publish).
func (b *lostConfirm) heal(t *testing.T) {
	t.Helper()
	b.proxy.Heal()
	require.Eventually(t, func() bool {
		var ue *rabbitmq.UnroutableError
		return errors.As(b.pub.Publish(testenv.Name("nowhere"), message.NewMessage(watermill.NewUUID(), nil)), &ue)
	}, time.Minute, 10*time.Millisecond, "the publisher reconnected")
}

// next returns the next delivery seen, within 15 s.
func (b *lostConfirm) next(t *testing.T) seen {
	t.Helper()
	select {
	case s := <-b.deliveries:
		return s
	case <-time.After(time.Minute):
		require.FailNow(t, "no delivery within a minute")
		return seen{}
	}
}

// split takes n deliveries, in whatever order they end, and parts the
// original's (redelivered) from the copies back from a tier.
func (b *lostConfirm) split(t *testing.T, n int) (original, copies []seen) {
	t.Helper()
	for range n {
		if d := b.next(t); d.from == "" {
			original = append(original, d)
		} else {
			copies = append(copies, d)
		}
	}
	return original, copies
}

// await waits for ch to close, within 15 s.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		require.FailNow(t, what)
	}
}

// retryStages are the stages of a retrying handler with the PostgreSQL
// inbox, its copies published by pub.
func retryStages(store deduplication.Store, consumer string) func(pub message.Publisher) router.Stages {
	return func(pub message.Publisher) router.Stages {
		return router.Stages{
			Poison:    &poison.Config{Publisher: pub, ParkPublisher: pub, Env: sluice.Env{PublishBackoff: 10 * time.Millisecond}},
			Retry:     &retrytiers.Config{Publisher: pub, Env: sluice.Env{PublishBackoff: 10 * time.Millisecond}},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: store, Consumer: consumer},
			Recoverer: &stage.RecovererConfig{},
		}
	}
}

// reserve is the handler's effect: one row for the event.
func reserve(schema string, msg *message.Message) error {
	_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
		fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), msg.Metadata.Get(sluice.EventIDKey))
	return err
}

var errRefused = sluice.Transient(errors.New("stock service: connection refused"))

// A failing delivery whose retry copy reached its tier but whose confirm was
// lost (a proxy in front of the broker drops the publisher's replies) makes
// one copy chain: no copy in another tier, the original nacked and
// redelivered, one effect in the end. Before ErrPublishUncertain the stage
// took the lost confirm for a refusal and parked a second copy in the next
// tier: two retry chains for one delivery.
func TestLostConfirmMakesOneRetryChain(t *testing.T) {
	t.Parallel()
	db, schema, store := inbox(t)
	b := startLostConfirm(t, "lost_confirm", retryStages(store, "lost_confirm"), func(n int64, msg *message.Message) error {
		if n == 1 {
			return errRefused
		}
		return reserve(schema, msg)
	}, copyTier, time.Minute)
	tier1, tier2 := b.q.Topology().Tiers()[0].Topic, b.q.Topology().Tiers()[1].Topic

	d := b.next(t)
	require.Equal(t, b.event.UUID, d.uuid)
	require.ErrorIs(t, d.err, sluice.ErrPublishUncertain, "nacked after the uncertain publish")
	require.Equal(t, sluice.Outcome(""), d.outcome, "not recorded as retried")

	// The redelivered original and the copy stored in the first tier come
	// back: one runs the handler, the inbox skips the other.
	original, copies := b.split(t, 2)
	require.Len(t, original, 1)
	require.Equal(t, "true", original[0].redelivered, "the original was nacked and redelivered")
	require.Equal(t, b.event.UUID, original[0].uuid)
	require.Len(t, copies, 1)
	require.Equal(t, tier1, copies[0].from, "the one copy waited in the first tier")
	require.Equal(t, "2", copies[0].attempt)
	require.NotEmpty(t, copies[0].copyID)
	require.Equal(t, copies[0].copyID, copies[0].uuid, "the copy carries its identity as its message id")
	require.ElementsMatch(t, []sluice.Outcome{"", sluice.OutcomeDuplicate}, // "": processed (no Trace stage records it)
		[]sluice.Outcome{original[0].outcome, copies[0].outcome}, "one ran the handler, the inbox skipped the other")

	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, tier2), "no copy in a second tier: one retry chain")
	require.Zero(t, testenv.QueueDepth(t, conn, tier1))
	require.Zero(t, testenv.QueueDepth(t, conn, b.q.Topology().Config().PoisonQueue))
	var effects int
	require.NoError(t, db.Get(&effects, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
	require.Equal(t, 1, effects, "one effect")
	select {
	case d := <-b.deliveries:
		require.FailNow(t, "a delivery more", "%+v", d)
	default:
	}
}

// When the redelivery after a lost confirm fails too, its copy goes to the
// same tier as the one that may be stored there, with the same identity:
// the first tier holds two copies of one delivery, recognised as one — the
// inbox runs the handler for one, the other is a duplicate — and the
// second tier holds none.
func TestSecondCopyAfterALostConfirmHasTheSameIdentity(t *testing.T) {
	t.Parallel()
	db, schema, store := inbox(t)
	healed := make(chan struct{})
	b := startLostConfirm(t, "second_copy", retryStages(store, "second_copy"), func(n int64, msg *message.Message) error {
		switch n {
		case 1:
			return errRefused
		case 2:
			<-healed
			return errRefused
		}
		return reserve(schema, msg)
	}, copyTier, time.Minute)
	tier1, tier2 := b.q.Topology().Tiers()[0].Topic, b.q.Topology().Tiers()[1].Topic

	require.ErrorIs(t, b.next(t).err, sluice.ErrPublishUncertain)
	b.heal(t)
	close(healed)
	// The redelivery (its copy confirmed) and the two copies in the first
	// tier.
	original, copies := b.split(t, 3)
	require.Len(t, original, 1)
	require.Equal(t, "true", original[0].redelivered)
	require.Equal(t, sluice.OutcomeRetried, original[0].outcome, "the redelivery's copy is confirmed")
	require.Len(t, copies, 2)
	for _, c := range copies {
		require.NoError(t, c.err)
		require.Equal(t, tier1, c.from)
		require.Equal(t, "2", c.attempt)
		require.NotEmpty(t, c.copyID)
		require.Equal(t, c.copyID, c.uuid)
	}
	require.Equal(t, copies[0].copyID, copies[1].copyID, "two copies of one delivery, one identity")
	require.ElementsMatch(t, []sluice.Outcome{"", sluice.OutcomeDuplicate}, []sluice.Outcome{copies[0].outcome, copies[1].outcome})

	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, tier2), "no copy in a second tier")
	var effects int
	require.NoError(t, db.Get(&effects, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
	require.Equal(t, 1, effects, "one effect")
}

// A poison delivery whose poison copy reached the poison queue but whose
// confirm was lost is not parked as well: the original is nacked and
// redelivered, and no copy waits in the park topic (the first tier) to come
// back as another poison entry. Before ErrPublishUncertain the stage took
// the lost confirm for a refusal and parked a second diagnosed copy. The
// redelivery's entry and the one whose confirm was lost carry one identity.
func TestLostPoisonConfirmIsNotParked(t *testing.T) {
	t.Parallel()
	healed := make(chan struct{})
	b := startLostConfirm(t, "lost_poison_confirm", func(pub message.Publisher) router.Stages {
		return router.Stages{
			Poison:   &poison.Config{Publisher: pub, ParkPublisher: pub, Env: sluice.Env{PublishBackoff: 10 * time.Millisecond}},
			Retry:    &retrytiers.Config{Publisher: pub, Env: sluice.Env{PublishBackoff: 10 * time.Millisecond}},
			Classify: &stage.ClassifyConfig{},
		}
	}, func(n int64, _ *message.Message) error {
		if n == 2 {
			<-healed
		}
		return sluice.Poison(errors.New("unknown version 7"))
	}, time.Minute)
	park := b.q.Topology().Tiers()[0].Topic

	d := b.next(t)
	require.ErrorIs(t, d.err, sluice.ErrPublishUncertain, "nacked after the uncertain publish")
	require.NotEqual(t, sluice.OutcomeParked, d.outcome)
	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, park), "no second copy parked")

	b.heal(t)
	close(healed)
	d = b.next(t)
	require.NoError(t, d.err)
	require.Equal(t, "true", d.redelivered, "the original was nacked and redelivered")
	require.Equal(t, sluice.OutcomePoisoned, d.outcome)

	require.Zero(t, testenv.QueueDepth(t, conn, park), "nothing parked")
	entries := testenv.Drain(t, conn, b.q.Topology().Config().PoisonQueue)
	require.Len(t, entries, 2, "the copy whose confirm was lost, and the redelivery's")
	ids := map[any]bool{}
	for _, e := range entries {
		require.Equal(t, "evt-lost_poison_confirm", e.Headers[sluice.EventIDKey])
		require.Equal(t, e.Headers[sluice.CopyIDKey], e.Headers["_watermill_message_uuid"])
		ids[e.Headers[sluice.CopyIDKey]] = true
	}
	require.Len(t, ids, 1, "two entries, one identity: one item for `sluice dlq stats` and a replay")
}
