package rabbitmq_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Issue 18 item 3: the Publisher's size of a content header is the
// broker's, to the byte. The largest publishing the Publisher sends (found
// by bisection: every larger one is refused before it is sent, as
// sluice.ErrUnpublishable, and the connection stays up) is taken by the
// broker; the same publishing sent larger by a bare amqp091 channel makes
// the broker close that connection with FRAME_ERROR (501), reporting the
// size the Publisher computes. (RabbitMQ tolerates 8 bytes over frame_max
// less 8 — its FRAME_SIZE_FUDGE for old clients; the Publisher keeps to the
// protocol's limit, which the broker reports.) The publishing has every
// kind of property and header field.
func TestPublisherRefusesAContentHeaderOverTheFrameToTheByte(t *testing.T) {
	t.Parallel()
	queue := declareQueue(t, "frame")
	reader := sdkmetric.NewManualReader()
	ts := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		Marshaler: rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{PostprocessPublishing: func(p amqp.Publishing) amqp.Publishing {
			p.Headers["i64"], p.Headers["bool"], p.Headers["f64"], p.Headers["dec"] = int64(-7), true, 1.5, amqp.Decimal{Scale: 2, Value: 1234}
			p.Headers["time"], p.Headers["bytes"], p.Headers["nil"] = ts, []byte{0, 1, 2}, nil
			p.Headers["nested"] = amqp.Table{"a": []any{int32(1), "two", amqp.Table{"b": int16(3)}}, "c": uint8(4)}
			p.Expiration = "60000"
			return p
		}}},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	publish := func(n int) error {
		m := message.NewMessage("u-1", []byte("body"))
		m.Metadata.Set(sluice.EventIDKey, "evt-1")
		m.Metadata.Set(metakeys.PropertyContentType, "application/json")
		m.Metadata.Set(metakeys.PropertyCorrelationID, "corr-1")
		m.Metadata.Set(metakeys.PropertyMessageID, "m-1")
		m.Metadata.Set(metakeys.PropertyTimestamp, ts.Format(time.RFC3339))
		m.Metadata.Set(metakeys.PropertyPriority, "3")
		m.Metadata.Set("blob", strings.Repeat("x", n))
		return pub.Publish(queue, m)
	}
	conn := testenv.AMQP(t)
	for range 9 { // delivery tags of two digits from here on: one size for one blob
		require.NoError(t, publish(0))
	}
	lo, hi := 0, conn.Config.FrameSize // lo is published, hi is refused
	require.NoError(t, publish(lo))
	err = publish(hi)
	require.ErrorIs(t, err, sluice.ErrUnpublishable)
	fe, ok := errors.AsType[*rabbitmq.FrameSizeError](err)
	require.True(t, ok, "%v", err)
	require.Equal(t, conn.Config.FrameSize-8, fe.Max)
	require.Equal(t, "blob", fe.Largest)
	require.NotContains(t, err.Error(), "xxxx", "never the value")
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if err := publish(mid); err != nil {
			require.ErrorIs(t, err, sluice.ErrUnpublishable)
			hi = mid
		} else {
			lo = mid
		}
	}
	require.NoError(t, publish(lo), "the largest that fits, published again: the broker takes it")
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricPublishReconnects), "no refusal closed the publisher's channel or connection")

	got := testenv.Drain(t, conn, queue)
	d := got[len(got)-1]
	require.Len(t, d.Headers["blob"], lo)
	const over = 9 // past the broker's fudge
	d.Headers["blob"] = d.Headers["blob"].(string) + strings.Repeat("x", over)
	raw := testenv.AMQP(t)
	closed := raw.NotifyClose(make(chan *amqp.Error, 1))
	ch := testenv.Channel(t, raw)
	// The broker closes the connection on the content header, so the body's
	// write may already fail ("channel/connection is not open"): what counts
	// is the close and its reason.
	_ = ch.Publish("", queue, false, false, amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode, Priority: d.Priority,
		CorrelationId: d.CorrelationId, MessageId: d.MessageId, Timestamp: d.Timestamp, Expiration: d.Expiration, Body: d.Body,
	})
	select {
	case e := <-closed:
		require.NotNil(t, e)
		require.Equal(t, amqp.FrameError, e.Code, "%v", e)
		require.Contains(t, e.Reason, fmt.Sprintf("{frame_too_large,%d,%d}", fe.Max+over, fe.Max),
			"the broker counts the largest publishing the Publisher sends as exactly the frame's payload")
	case <-time.After(time.Minute):
		t.Fatal("the broker took a content header over what the Publisher allows: its size is not the broker's")
	}
}

// A header amqp091 cannot encode (a nested table's key over 255 bytes) is
// refused before anything is sent: amqp091 would fail it after writing the
// publish's method frame, leaving the connection out of step. The next
// publish on the same connection is confirmed.
func TestPublisherRefusesAHeaderAMQPCannotEncode(t *testing.T) {
	t.Parallel()
	queue := declareQueue(t, "encode")
	reader := sdkmetric.NewManualReader()
	bad := true
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		Marshaler: rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{PostprocessPublishing: func(p amqp.Publishing) amqp.Publishing {
			if bad {
				p.Headers["nested"] = amqp.Table{strings.Repeat("k", 300): "v"}
			}
			return p
		}}},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	err = pub.Publish(queue, message.NewMessage("u-1", nil))
	require.ErrorIs(t, err, sluice.ErrUnpublishable)
	require.ErrorContains(t, err, "a table key of 300 bytes")
	bad = false
	require.NoError(t, pub.Publish(queue, message.NewMessage("u-2", nil)))
	require.Len(t, testenv.Drain(t, testenv.AMQP(t), queue), 1)
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricPublishReconnects))
}
