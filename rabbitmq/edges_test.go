package rabbitmq_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
)

// Behind Watermill's Timeout a handler that runs out of time fails with
// context.DeadlineExceeded and an expired message context. Its copy must
// still reach the tier (published on a detached context), so the message
// runs the ladder once and ends in exactly one poison copy — not a hot
// redelivery loop.
func TestStackTimeoutReachesTheTiers(t *testing.T) {
	t.Parallel()
	outer := []message.HandlerMiddleware{wmiddleware.Timeout(100 * time.Millisecond)}
	s := newStackBehind(t, rabbitmq.TopologyConfig{}, outer, func(_ *stack, msg *message.Message) error {
		<-msg.Context().Done()
		return msg.Context().Err()
	})
	s.publish(t, "evt-slow")
	s.handled(t, "evt-slow", 4)
	got := s.settled(t, 1)
	require.Equal(t, "exhausted", got[0].Headers[metakeys.PoisonClass])
	require.Contains(t, got[0].Headers[metakeys.PoisonReason], "deadline exceeded")
	attempts := []string{}
	for _, d := range s.deliveries("evt-slow") {
		attempts = append(attempts, d.Metadata.Get(sluice.AttemptKey))
	}
	require.Equal(t, []string{"", "2", "3", "4"}, attempts, "one delivery per attempt, no redelivery loop")
}

// foreignPublishing is what a Spring AMQP or .NET producer sends: every AMQP
// property set, its own typed headers, no Watermill UUID.
func foreignPublishing() amqp.Publishing {
	return amqp.Publishing{
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		CorrelationId:   "corr-42",
		MessageId:       "spring-msg-1",
		Type:            "com.example.OrderCreated",
		AppId:           "orders-service",
		UserId:          "guest",
		ReplyTo:         "orders.replies",
		Timestamp:       time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		Priority:        7,
		DeliveryMode:    amqp.Persistent,
		Headers: amqp.Table{
			"__TypeId__":      "com.example.OrderCreated",
			"sluice_event_id": "evt-foreign",
			"retries":         int32(0),
		},
		Body: []byte("\x1f\x8b\x08\x00binary gzip body"),
	}
}

// requireSameProperties checks that d carries p's properties byte for byte,
// expiration and user id aside (the tiers own TTL; a copy is published by
// Sluice's own user).
func requireSameProperties(t *testing.T, p amqp.Publishing, d amqp.Delivery, what string) {
	t.Helper()
	require.Equal(t, p.ContentType, d.ContentType, what)
	require.Equal(t, p.ContentEncoding, d.ContentEncoding, what)
	require.Equal(t, p.CorrelationId, d.CorrelationId, what)
	require.Equal(t, p.MessageId, d.MessageId, what)
	require.Equal(t, p.Type, d.Type, what)
	require.Equal(t, p.AppId, d.AppId, what)
	require.Equal(t, p.ReplyTo, d.ReplyTo, what)
	require.True(t, p.Timestamp.Equal(d.Timestamp), "%s: timestamp %s, want %s", what, d.Timestamp, p.Timestamp)
	require.Equal(t, p.Priority, d.Priority, what)
	require.Equal(t, p.Body, d.Body, what)
	require.Empty(t, d.Expiration, what)
}

// A foreign producer publishes to an exchange with a routing key other than
// the queue's name. The handler reads the properties; the retry copy and the
// poison copy carry them as properties; the diagnosis names the producer's
// exchange and routing key (not the dead-letter hop) and the consumer's
// queue as the replay target.
func TestStackForeignProducerPropertiesAndOrigin(t *testing.T) {
	t.Parallel()
	exchange := testenv.Name("x")
	s := newStack(t, rabbitmq.TopologyConfig{Exchange: exchange, BindingKey: "orders.#"}, func(s *stack, msg *message.Message) error {
		if len(s.deliveries("evt-foreign")) == 1 {
			return sluice.Transient(errStockTimeout)
		}
		return sluice.Poison(errors.New("unknown version"))
	})
	pub := foreignPublishing()
	ch := testenv.Channel(t, s.conn)
	require.NoError(t, ch.PublishWithContext(context.Background(), exchange, "orders.created.eu", true, false, pub))

	s.handled(t, "evt-foreign", 2)
	got := s.settled(t, 1)
	for i, d := range s.deliveries("evt-foreign") {
		md := d.Metadata
		require.Equal(t, "application/json", md.Get(metakeys.PropertyContentType), "delivery %d", i)
		require.Equal(t, "gzip", md.Get(metakeys.PropertyContentEncoding))
		require.Equal(t, "corr-42", md.Get(metakeys.PropertyCorrelationID))
		require.Equal(t, "spring-msg-1", md.Get(metakeys.PropertyMessageID))
		require.Equal(t, "com.example.OrderCreated", md.Get(metakeys.PropertyType))
		require.Equal(t, "orders-service", md.Get(metakeys.PropertyAppID))
		if i == 0 {
			require.Equal(t, "guest", md.Get(metakeys.PropertyUserID), "the broker validated the producer's user_id")
		} else {
			require.Empty(t, md.Get(metakeys.PropertyUserID), "the tier's copy was published by Sluice, without user_id")
			require.Equal(t, "guest", md.Get(metakeys.OriginUserID), "the producer's user id, recorded on the copy")
		}
		require.Equal(t, "orders.replies", md.Get(metakeys.PropertyReplyTo))
		require.Equal(t, "2026-11-30T12:00:00Z", md.Get(metakeys.PropertyTimestamp))
		require.Equal(t, "7", md.Get(metakeys.PropertyPriority))
		require.Equal(t, "com.example.OrderCreated", md.Get("__TypeId__"))
		require.Equal(t, "0", md.Get("retries"))
	}
	second := s.deliveries("evt-foreign")[1]
	require.Equal(t, "2", second.Metadata.Get(sluice.AttemptKey), "the second delivery is the tier's copy")
	require.Equal(t, "", second.Metadata.Get(metakeys.SourceExchange), "the copy came back through the dead-letter hop")

	p := got[0]
	requireSameProperties(t, pub, p, "poison copy")
	require.Equal(t, "poison", p.Headers[metakeys.PoisonClass])
	require.Equal(t, exchange, p.Headers[metakeys.PoisonExchange], "the producer's exchange, not the dead-letter hop")
	require.Equal(t, "orders.created.eu", p.Headers[metakeys.PoisonRoutingKey])
	require.Equal(t, s.topo.Config().Queue, p.Headers[metakeys.PoisonQueue], "replays go to the consumer's queue")
	require.Equal(t, "guest", p.Headers[metakeys.OriginUserID], "the producer's user id travels as a header")
	for k := range p.Headers {
		require.False(t, strings.HasPrefix(k, metakeys.PropertyPrefix), "property %s is restored as a property, not a header", k)
	}
}

// The retry copy itself carries the properties: read straight from a tier
// queue that dead-letters nowhere the consumer reads.
func TestRetryCopyCarriesTheProperties(t *testing.T) {
	t.Parallel()
	topo := newTopology(t, rabbitmq.TopologyConfig{TierDelays: []time.Duration{time.Hour}})
	conn := testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	pub := foreignPublishing()
	pub.UserId = ""
	require.NoError(t, ch.PublishWithContext(context.Background(), "", topo.Config().Queue, false, false, pub))
	d, ok, err := ch.Get(topo.Config().Queue, false)
	require.NoError(t, err)
	require.True(t, ok)
	msg, err := rabbitmq.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	require.Equal(t, "spring-msg-1", msg.UUID, "a foreign message without a Watermill UUID is named by its message id")

	mw, err := retrytiers.New(retrytiers.Config{Publisher: newPublisher(t, ""), Tiers: topo.Tiers()})
	require.NoError(t, err)
	_, err = mw(func(*message.Message) ([]*message.Message, error) { return nil, errStockTimeout })(msg)
	require.NoError(t, err)
	require.NoError(t, d.Ack(false))

	tierCopy, ok, err := ch.Get(topo.Tiers()[0].Topic, true)
	require.NoError(t, err)
	require.True(t, ok)
	requireSameProperties(t, pub, tierCopy, "tier copy")
	require.Equal(t, "", tierCopy.Headers[metakeys.OriginExchange])
	require.Equal(t, topo.Config().Queue, tierCopy.Headers[metakeys.OriginRoutingKey])
}

// Names at AMQP's 255-byte limit: what fits is used, what does not is
// refused with an error naming the limit — never cut short onto another
// queue.
func TestNamesAtTheLimit(t *testing.T) {
	t.Parallel()
	base := testenv.Name("q")
	name := func(n int) string { return base + strings.Repeat("n", n-len(base)) }

	require.Equal(t, 245, rabbitmq.MaxQueueLength(nil, true))
	// The longest queue the default ladder allows is declared and used.
	topo := newTopology(t, rabbitmq.TopologyConfig{Queue: name(245)})
	require.Len(t, topo.Tiers()[2].Topic, 255)
	pub := newPublisher(t, "")
	require.NoError(t, pub.Publish(topo.Tiers()[2].Topic, msgs(1)...), "a 255-byte tier queue takes messages")

	// 194-200 bytes: allowed, as the docs always said.
	_, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: name(200)})
	require.NoError(t, err)

	_, err = rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: name(246)})
	require.ErrorIs(t, err, broker.ErrNameTooLong)
	require.ErrorContains(t, err, "at most 245")
	_, err = rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: name(250), PoisonQueue: name(251)})
	require.ErrorIs(t, err, broker.ErrNameTooLong)
	_, err = broker.Ladder(name(250))
	require.ErrorIs(t, err, broker.ErrNameTooLong)
	_, err = rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Exchange: name(256)})
	require.ErrorIs(t, err, broker.ErrNameTooLong)

	// A 276-byte routing key would reach the wire as its first 20 bytes
	// (276 mod 256): a queue of that name must receive nothing.
	long := name(276)
	victim := long[:20]
	conn := testenv.AMQP(t)
	_, err = testenv.Channel(t, conn).QueueDeclare(victim, false, true, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, victim)
	err = pub.Publish(long, msgs(1)...)
	require.ErrorIs(t, err, broker.ErrNameTooLong)
	require.ErrorContains(t, err, "276 bytes")
	require.Equal(t, 0, testenv.QueueDepth(t, conn, victim))

	// A header name AMQP cannot carry.
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(strings.Repeat("h", 256), "v")
	require.ErrorIs(t, pub.Publish(topo.Config().Queue, m), broker.ErrNameTooLong)
	m = message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(metakeys.PropertyCorrelationID, strings.Repeat("c", 256))
	require.ErrorIs(t, pub.Publish(topo.Config().Queue, m), broker.ErrNameTooLong)
}

// A publish to an exchange that does not exist keeps the broker's reason.
func TestPublisherMissingExchangeKeepsTheReason(t *testing.T) {
	t.Parallel()
	pub := newPublisher(t, testenv.Name("missing"))
	err := pub.Publish("anything", msgs(1)...)
	require.ErrorIs(t, err, rabbitmq.ErrChannelClosed)
	require.ErrorIs(t, err, rabbitmq.ErrRefused, "the close answered it: not stored, not uncertain")
	require.NotErrorIs(t, err, sluice.ErrPublishUncertain)
	var ae *amqp.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, amqp.NotFound, ae.Code)
	require.ErrorContains(t, err, "NOT_FOUND")
}

// When the server cancels the consumer (its queue deleted), amqp091 closes
// the deliveries channel; the zero deliveries read from it never become
// messages: the handler is not called and nothing reaches the poison queue.
func TestQueueDeletedMakesNoPhantomMessages(t *testing.T) {
	t.Parallel()
	s := newStack(t, rabbitmq.TopologyConfig{}, func(*stack, *message.Message) error { return nil })
	s.publish(t, "evt-1")
	s.handled(t, "evt-1", 1)
	ch := testenv.Channel(t, s.conn)
	_, err := ch.QueueDelete(s.topo.Config().Queue, false, false, false)
	require.NoError(t, err)
	calls := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		n := 0
		for _, c := range s.calls {
			n += len(c)
		}
		return n
	}
	// The window in which phantom messages used to appear, by its event
	// rather than a second a loaded machine may not reach the cancel in:
	// the cancelled consumer's zero delivery met the marshaler, refused,
	// or a phantom reached the handler.
	require.Eventually(t, func() bool {
		return calls() > 1 || slices.ContainsFunc(s.log.Lines(""), func(l testenv.LogLine) bool { return errors.Is(l.Err, rabbitmq.ErrNoDelivery) })
	}, time.Minute, 10*time.Millisecond, "the cancelled consumer's zero delivery read")
	require.Equal(t, 1, calls(), "only the real delivery reached the handler")
	require.Equal(t, 0, testenv.QueueDepth(t, s.conn, s.topo.Config().PoisonQueue))
}

// Errors about a malformed URL never hold its password, nor a fragment of it.
func TestURLErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"amqp://user:Sec%zzRet@host/", "amqp://user:SecRet@ho st/", "amqpx://user:SecRet@host/"} {
		_, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: u}})
		require.Error(t, err)
		require.NotContains(t, err.Error(), "Sec", u)
		require.NotContains(t, err.Error(), "Ret", u)
		_, err = rabbitmq.NewWatermillSubscriber(rabbitmq.Connection{URL: u})
		require.Error(t, err)
		require.NotContains(t, err.Error(), "Sec", u)
	}
	_, err := rabbitmq.Dial(rabbitmq.Connection{URL: "amqp://guest:WrongPassword1@127.0.0.1:5672/"}, "")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "WrongPassword1")
	require.ErrorIs(t, err, amqp.ErrCredentials, "the cause survives the redaction")
}
