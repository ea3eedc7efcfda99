package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

func newPublisher(t *testing.T, exchange string) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Exchange: exchange, ConfirmTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// declareQueue declares a durable classic queue of t's own.
func declareQueue(t *testing.T, prefix string) string {
	t.Helper()
	name := testenv.Name(prefix)
	ch := testenv.Channel(t, testenv.AMQP(t))
	_, err := ch.QueueDeclare(name, true, false, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, name)
	return name
}

func msgs(n int) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		out[i] = message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"n":%d}`, i))
		out[i].Metadata.Set("sluice_event_id", fmt.Sprint("evt-", i))
	}
	return out
}

func TestPublisherConfirmsABatch(t *testing.T) {
	t.Parallel()
	q := declareQueue(t, "pub_batch")
	p := newPublisher(t, "")
	require.NoError(t, p.Publish(q, msgs(500)...))
	require.Equal(t, 500, testenv.QueueDepth(t, testenv.AMQP(t), q), "every confirmed message is in the queue")

	got := testenv.Drain(t, testenv.AMQP(t), q)
	require.Equal(t, uint8(2), got[0].DeliveryMode, "persistent")
	require.Equal(t, "evt-0", got[0].Headers["sluice_event_id"])
}

func TestPublisherUnroutableIsAnError(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, "")
	missing := testenv.Name("no_such_queue")
	err := p.Publish(missing, msgs(1)...)
	var ue *rabbitmq.UnroutableError
	require.ErrorAs(t, err, &ue, "RabbitMQ confirms an unroutable message; the return must make it an error")
	require.Equal(t, missing, ue.RoutingKey)
	require.Equal(t, uint16(312), ue.ReplyCode) // NO_ROUTE
	// Issue 44, item 3: what is missing, and the command that declares it.
	require.Contains(t, err.Error(), fmt.Sprintf("no queue named %q exists", missing))
	require.Contains(t, err.Error(), "`sluice topology apply --queue "+missing+"`")

	// In a batch, only the unroutable message fails, and the channel stays usable.
	q := declareQueue(t, "pub_mixed")
	require.NoError(t, p.Publish(q, msgs(3)...))
	err = errors.Join(p.Publish(missing, msgs(2)...), p.Publish(q, msgs(2)...))
	require.ErrorAs(t, err, &ue)
	require.Equal(t, 5, testenv.QueueDepth(t, testenv.AMQP(t), q))
}

func TestPublisherNamedExchange(t *testing.T) {
	t.Parallel()
	conn := testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	ex := testenv.Name("ex")
	require.NoError(t, ch.ExchangeDeclare(ex, "topic", true, false, false, false, nil))
	testenv.DeleteQueuesAtEnd(t, "exchange:"+ex)
	p := newPublisher(t, ex)

	var ue *rabbitmq.UnroutableError
	require.ErrorAs(t, p.Publish("orders.created", msgs(1)...), &ue, "no binding yet")
	require.Equal(t, ex, ue.Exchange)
	require.Contains(t, ue.Error(), fmt.Sprintf("exchange %q, routing key %q: nothing is bound to the exchange for this routing key", ex, "orders.created"))
	require.Contains(t, ue.Error(), "rabbitmqadmin declare binding source="+ex+" destination=QUEUE routing_key=orders.created")

	q := declareQueue(t, "pub_bound")
	require.NoError(t, ch.QueueBind(q, "orders.*", ex, false, nil))
	require.NoError(t, p.Publish("orders.created", msgs(2)...))
	require.Equal(t, 2, testenv.QueueDepth(t, conn, q))
}

func TestPublisherReconnectsAfterChannelError(t *testing.T) {
	t.Parallel()
	conn := testenv.AMQP(t)
	ex := testenv.Name("ex_later")
	testenv.DeleteQueuesAtEnd(t, "exchange:"+ex)
	p := newPublisher(t, ex)

	// Publishing to an exchange that does not exist: RabbitMQ closes the
	// channel (404), so the message is not confirmed.
	err := p.Publish("k", msgs(1)...)
	require.Error(t, err)
	require.NotErrorIs(t, err, rabbitmq.ErrNacked)

	ch := testenv.Channel(t, conn)
	require.NoError(t, ch.ExchangeDeclare(ex, "direct", true, false, false, false, nil))
	q := declareQueue(t, "pub_reconnect")
	require.NoError(t, ch.QueueBind(q, "k", ex, false, nil))
	require.NoError(t, p.Publish("k", msgs(3)...), "the publisher opens a new channel")
	require.Equal(t, 3, testenv.QueueDepth(t, conn, q))
}

func TestPublisherMessageContext(t *testing.T) {
	t.Parallel()
	q := declareQueue(t, "pub_ctx")
	p := newPublisher(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m := msgs(1)[0]
	m.SetContext(ctx)
	require.ErrorIs(t, p.Publish(q, m), context.Canceled)
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), q), "a message whose context ended is not published")
}

func TestPublisherClose(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, "")
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "idempotent")
	require.ErrorIs(t, p.Publish("q", msgs(1)...), rabbitmq.ErrPublisherClosed)
}

func TestNewPublisherValidates(t *testing.T) {
	t.Parallel()
	_, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{})
	require.ErrorContains(t, err, "PublisherConfig.URL is required")
	_, err = rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: "http://guest:secret@host/"}})
	require.ErrorContains(t, err, "PublisherConfig.URL")
	require.NotContains(t, err.Error(), "secret", "no password in errors")

	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: "amqp://guest:secret@127.0.0.1:1/", DialTimeout: time.Second}})
	require.NoError(t, err)
	err = p.Publish("q", msgs(1)...)
	require.ErrorContains(t, err, "amqp://guest:xxxxx@127.0.0.1:1/")
	require.NotContains(t, err.Error(), "secret")
}

func TestPublisherConfirmMetric(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	q := declareQueue(t, "pub_metric")
	require.NoError(t, p.Publish(q, msgs(3)...))
	require.Error(t, p.Publish(testenv.Name("missing"), msgs(1)...))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	counts := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == telemetry.MetricPublishConfirmDuration {
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					o, _ := dp.Attributes.Value("sluice.confirm")
					counts[o.AsString()] += dp.Count
				}
			}
		}
	}
	require.Equal(t, map[string]uint64{"acked": 3, "returned": 1}, counts)
}

// PublishEach reports each message's outcome in order: a message the
// marshaler refuses fails alone, the others of the call are confirmed.
func TestPublisherPublishEachReportsEveryMessage(t *testing.T) {
	t.Parallel()
	q := declareQueue(t, "pub_each")
	p := newPublisher(t, "")
	batch := msgs(5)
	batch[2].Metadata.Set(metakeys.PropertyPriority, "high") // not a number: unpublishable
	errs := p.PublishEach(q, batch...)
	require.Len(t, errs, 5)
	for i, err := range errs {
		if i == 2 {
			require.ErrorIs(t, err, sluice.ErrUnpublishable)
			continue
		}
		require.NoError(t, err, "message %d", i)
	}
	require.Equal(t, 4, testenv.QueueDepth(t, testenv.AMQP(t), q))

	// A failure before any message is sent is every message's.
	errs = p.PublishEach(strings.Repeat("q", 256), msgs(2)...)
	require.Len(t, errs, 2)
	require.ErrorIs(t, errs[0], broker.ErrNameTooLong)
	require.ErrorIs(t, errs[1], broker.ErrNameTooLong)
	err := p.Publish(strings.Repeat("q", 256), msgs(2)...)
	require.Equal(t, 1, strings.Count(err.Error(), "255"), "Publish names such a failure once: %v", err)
}
