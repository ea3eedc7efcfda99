package outbox_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/signing"
	"github.com/sluicemq/sluice/sluicesql"
)

// producer is an outbox written by a service that does not consume (Write
// in its own transaction), its relay on RabbitMQ.
type producer struct {
	t      *testing.T
	db     *sqlx.DB
	schema string
	store  *sluicesql.Outbox
	meter  *sdkmetric.ManualReader
}

func newProducer(t *testing.T, cfg sluicesql.OutboxConfig) *producer {
	t.Helper()
	db := testenv.Postgres(t)
	p := &producer{t: t, db: db, schema: testenv.Schema(t, db), meter: sdkmetric.NewManualReader()}
	testenv.Migrate(t, db, sluicesql.Config{Schema: p.schema, Outbox: sluicesql.OutboxConfig{Table: "outbox"}})
	cfg.Table = p.schema + ".outbox"
	var err error
	p.store, err = sluicesql.NewOutbox(db, cfg)
	require.NoError(t, err)
	return p
}

// write writes msgs to topic in a transaction of its own and returns
// Write's error (the transaction rolled back then).
func (p *producer) write(topic string, msgs ...*message.Message) error {
	tx, err := p.db.BeginTxx(p.t.Context(), nil)
	require.NoError(p.t, err)
	defer func() { _ = tx.Rollback() }()
	if err := p.store.Write(p.t.Context(), tx, topic, msgs...); err != nil {
		return err
	}
	require.NoError(p.t, tx.Commit())
	p.store.Wake()
	return nil
}

// relay runs a relay of the outbox on pub until the test ends.
func (p *producer) relay(pub message.Publisher) {
	r, err := outbox.NewRelay(p.store, pub, outbox.RelayConfig{RetryMin: time.Hour, RetryMax: time.Hour,
		Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.meter))}})
	require.NoError(p.t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	p.t.Cleanup(func() {
		require.NoError(p.t, r.Close())
		require.NoError(p.t, <-done)
	})
}

// row is what the outbox table holds of one row.
type row struct {
	Attempts  int    `db:"attempts"`
	LastError string `db:"last_error"`
}

func (p *producer) rows() []row {
	p.t.Helper()
	var rows []row
	require.NoError(p.t, p.db.Select(&rows, `SELECT attempts, coalesce(last_error, '') AS last_error FROM `+p.schema+`.outbox ORDER BY id`))
	return rows
}

// manyHeaders is a message with n metadata entries.
func manyHeaders(n int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte("many headers"))
	for i := range n {
		m.Metadata.Set(fmt.Sprintf("h%05d", i), "v")
	}
	return m
}

func newRabbitPublisher(t *testing.T) *rabbitmq.Publisher {
	t.Helper()
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// A message of more than 8,192 headers to a queue that does not exist comes
// back as a basic.return the AMQP client cannot parse (Headers nil), so it
// cannot be matched to its publish: the ack that follows is no confirm.
// The publish is uncertain and the relay keeps the row, as it keeps the row
// of a 10-header message to the same queue (returned: unroutable).
func TestAReturnWithUnparseableHeadersIsNoConfirm(t *testing.T) {
	t.Parallel()
	p := newProducer(t, sluicesql.OutboxConfig{})
	missing := testenv.Name("missing")
	testenv.DeleteQueuesAtEnd(t, missing)
	pub := newRabbitPublisher(t)

	t.Run("the publisher", func(t *testing.T) {
		err := pub.Publish(missing, manyHeaders(8300))
		require.Error(t, err, "a message the broker returned is not confirmed")
		require.Contains(t, err.Error(), "uncertain")
		require.Error(t, pub.Publish(missing, manyHeaders(10)), "returned: unroutable")
	})
	t.Run("the relay keeps the row", func(t *testing.T) {
		require.NoError(t, p.write(missing, manyHeaders(8300)))
		require.NoError(t, p.write(missing, manyHeaders(10)))
		p.relay(pub)
		require.Eventually(t, func() bool {
			return testenv.CounterSum(t, p.meter, telemetry.MetricOutboxFailures) >= 2
		}, 2*time.Minute, 10*time.Millisecond, "both rows were tried")
		require.Eventually(t, func() bool {
			rows := p.rows()
			return len(rows) == 2 && rows[0].Attempts == 1 && rows[1].Attempts == 1
		}, time.Minute, 10*time.Millisecond, "both rows stay, their failure recorded")
		rows := p.rows()
		require.Contains(t, rows[0].LastError, "cannot be matched")
		require.Contains(t, rows[1].LastError, "unroutable")
	})
}

// A message its publisher would refuse whenever it is published, or that
// its broker could not carry, is not written: Write fails with the reason,
// classified Poison, and writes nothing — instead of a row that fails every
// publish for ever (a header name over 255 bytes) or that closes the
// relay's channel on every batch (a CC header, a body over
// max_message_size). Behind the stages, the delivery that produced it goes
// to the poison queue with the reason; the others' messages go through.
func TestWhatCannotBePublishedIsRefusedWhenWritten(t *testing.T) {
	t.Parallel()
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL, MaxMessageSize: 64 << 10}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	withHeader := func(k, v string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		m.Metadata.Set(k, v)
		return m
	}

	t.Run("Write", func(t *testing.T) {
		p := newProducer(t, sluicesql.OutboxConfig{Checker: pub})
		topic := testenv.Name("dest")
		for name, m := range map[string]*message.Message{
			"CC":               withHeader("CC", "other-queue"),
			"BCC":              withHeader("BCC", "other-queue"),
			"header name":      withHeader(strings.Repeat("k", 256), "v"),
			"too many headers": manyHeaders(8192 + 1),
			"body":             message.NewMessage(watermill.NewUUID(), make([]byte, 64<<10+1)),
		} {
			err := p.write(topic, message.NewMessage(watermill.NewUUID(), nil), m)
			require.ErrorIs(t, err, sluice.ErrUnpublishable, name)
			require.Equal(t, sluice.ClassPoison, sluice.ClassOf(err), name)
			require.Contains(t, err.Error(), "message 1", name)
		}
		require.Empty(t, p.rows(), "nothing written")
		require.NoError(t, p.write(topic, manyHeaders(10), message.NewMessage(watermill.NewUUID(), make([]byte, 64<<10))))
		require.Len(t, p.rows(), 2)
	})

	t.Run("behind the stages", func(t *testing.T) {
		s := newService(t, testenv.AMQPURL)
		s.outbox, err = sluicesql.NewOutbox(s.db, sluicesql.OutboxConfig{Table: s.schema + ".outbox", Checker: pub})
		require.NoError(t, err)
		s.run(func(msg *message.Message) ([]*message.Message, error) {
			evt := message.NewMessage(watermill.NewUUID(), msg.Payload)
			if string(msg.Payload) == "bad" {
				evt.Metadata.Set("CC", "audit") // a string: RabbitMQ would close the channel
			}
			return []*message.Message{evt}, nil
		}, nil, true)
		s.relay(pub, outbox.RelayConfig{})
		s.send("evt-bad", "bad")
		s.send("evt-good", "good")
		require.Len(t, s.producedMessages(1), 1)
		poisoned := s.rabbit.Topology().Config().Queue + ".poison"
		require.Eventually(t, func() bool { return testenv.QueueDepth(t, s.conn, poisoned) == 1 }, 2*time.Minute, 10*time.Millisecond,
			"the delivery that produced it is poison")
		d := testenv.Drain(t, s.conn, poisoned)
		require.Equal(t, "bad", string(d[0].Body))
		require.Contains(t, d[0].Headers[metakeys.PoisonReason], "CC")
		// The good row's delete commits after the broker has its copy.
		require.Eventually(t, func() bool { return s.count("outbox") == 0 }, time.Minute, 10*time.Millisecond, "the good row relayed, the bad one never written")
	})
}

// receiver is a service consuming from its own queue that applies what it
// receives (the inbox's rows): the event ids it handled, each attempt
// failing Transient until failUntil (0: none fails).
type receiver struct {
	*service
	mu       sync.Mutex
	handled  []string // event ids, one per successful run
	attempts atomic.Int64
}

func newReceiver(t *testing.T, signer *signing.Signer, failUntil int, tiers ...time.Duration) *receiver {
	r := &receiver{service: newServiceWithTiers(t, testenv.AMQPURL, tiers...)}
	r.signer = signer
	r.run(func(msg *message.Message) ([]*message.Message, error) {
		r.attempts.Add(1)
		if n, err := sluice.Attempt(msg); err != nil || n < failUntil {
			return nil, sluice.Transient(fmt.Errorf("not yet: attempt %d", n))
		}
		r.mu.Lock()
		r.handled = append(r.handled, msg.Metadata.Get(sluice.EventIDKey))
		r.mu.Unlock()
		return nil, nil
	}, nil, true)
	return r
}

func (r *receiver) applied() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.handled)
}

// A handler that builds what it produces from the delivery's metadata (a
// common Watermill idiom: correlation, tracing) copies its event id; the
// outbox gives each such message an event id of its own when it writes it,
// so the receiving inbox applies all of them, not one and three
// "duplicates". An event id the handler sets on purpose is kept.
func TestAFanOutThatCopiesTheDeliverysMetadataIsAppliedWhole(t *testing.T) {
	t.Parallel()
	recv := newReceiver(t, nil, 0, 50*time.Millisecond)
	send := newService(t, testenv.AMQPURL)
	send.produced = recv.rabbit.Topology().Config().Queue
	send.run(func(msg *message.Message) ([]*message.Message, error) {
		out := make([]*message.Message, 5)
		for i := range out {
			out[i] = message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "line %d", i))
			out[i].Metadata = maps.Clone(msg.Metadata)
		}
		out[4].Metadata.Set(sluice.EventIDKey, "summary:"+msg.Metadata.Get(sluice.EventIDKey))
		return out, nil
	}, nil, true)
	send.relay(send.rabbit.Publisher(), outbox.RelayConfig{})
	send.send("order-1", "order")

	require.Eventually(t, func() bool { return len(recv.applied()) == 5 }, 2*time.Minute, 10*time.Millisecond,
		"the receiver applies each of the 5 produced events (it applied %v, poisoned %d, inbox %d, dup %d)", recv.applied(), testenv.QueueDepth(t, recv.conn, recv.rabbit.Topology().Config().Queue+".poison"), recv.count("inbox"), testenv.CounterSum(t, recv.meter, telemetry.MetricInboxDuplicates))
	ids := recv.applied()
	require.Contains(t, ids, "summary:order-1", "an event id set on purpose is kept")
	require.NotContains(t, ids, "order-1", "a copied event id is replaced")
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(ids))), 5)
	require.Eventually(t, func() bool { return recv.count("inbox") == 5 }, time.Minute, 10*time.Millisecond, "each committed")
	require.Zero(t, testenv.CounterSum(t, recv.meter, telemetry.MetricInboxDuplicates))
}

// With a signing key shared between services, a handler that forwards its
// delivery (msg.Copy()) through the outbox to another service's queue after
// three failed attempts does not bring that history along: the receiver
// takes each forwarded event as a first attempt — parked three times in its
// own tiers, then processed — not as exhausted at its first failure.
func TestAForwardedCopyCarriesNoRetryHistory(t *testing.T) {
	t.Parallel()
	signer, err := signing.New([]byte("a key the two services share, 32+ bytes"))
	require.NoError(t, err)
	tiers := []time.Duration{20 * time.Millisecond, 30 * time.Millisecond, 40 * time.Millisecond}
	recv := newReceiver(t, signer, 4, tiers...)
	send := newServiceWithTiers(t, testenv.AMQPURL, tiers...)
	send.signer = signer
	send.produced = recv.rabbit.Topology().Config().Queue
	var forwarded atomic.Int64
	send.run(func(msg *message.Message) ([]*message.Message, error) {
		if n, _ := sluice.Attempt(msg); n < 4 {
			return nil, sluice.Transient(fmt.Errorf("not yet: attempt %d", n))
		}
		forwarded.Add(1)
		return []*message.Message{msg.Copy()}, nil
	}, nil, true)
	send.relay(send.rabbit.Publisher(), outbox.RelayConfig{})
	for i := range 3 {
		send.send(fmt.Sprint("evt-", i), "payload")
	}
	require.Eventually(t, func() bool { return len(recv.applied()) == 3 }, 60*time.Second, 10*time.Millisecond,
		"the receiver processes the 3 forwarded events (poisoned: %d)",
		testenv.QueueDepth(t, recv.conn, recv.rabbit.Topology().Config().Queue+".poison"))
	require.Equal(t, int64(3), forwarded.Load(), "the sender forwarded each at its 4th attempt")
	require.Equal(t, int64(12), recv.attempts.Load(), "the receiver ran each 4 times: 3 parked, then processed (poisoned %d)", testenv.QueueDepth(t, recv.conn, recv.rabbit.Topology().Config().Queue+".poison"))
	require.Zero(t, testenv.QueueDepth(t, recv.conn, recv.rabbit.Topology().Config().Queue+".poison"))
}
