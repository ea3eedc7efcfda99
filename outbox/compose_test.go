package outbox_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
)

// Behind Watermill's own Timeout (outside the stages) and Retry (inside
// them, so inside the inbox): the first run outlives its deadline — its
// transaction ends with it, so its produced message cannot be written —
// Retry's second run in the same unit of work is refused by Reentry, the
// tier's copy produces. One produced message, one claim, two runs of the
// handler, nothing poisoned.
func TestTheOutboxBehindWatermillsTimeoutAndRetry(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	var runs atomic.Int64
	h := func(msg *message.Message) ([]*message.Message, error) {
		if runs.Add(1) == 1 {
			<-msg.Context().Done() // the first run outlives Watermill's Timeout
		}
		evt := message.NewMessage(watermill.NewUUID(), []byte(`{"reserved":true}`))
		evt.Metadata.Set(sluice.EventIDKey, "reserved:"+msg.Metadata.Get(sluice.EventIDKey))
		return []*message.Message{evt}, nil
	}
	s.runWith(h, nil, true,
		// 2 s, not less: only the first run must outlive it, and at 300 ms the
		// tier copy's run (claim, write, commit) outlived it too on a loaded
		// machine in make test, and went to poison.
		[]message.HandlerMiddleware{wmiddleware.Timeout(2 * time.Second)},
		[]message.HandlerMiddleware{wmiddleware.Retry{MaxRetries: 2, InitialInterval: 5 * time.Millisecond}.Middleware})
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{})
	s.send("evt-1", `{}`)
	got := s.producedMessages(1)
	require.Len(t, got, 1)
	require.Equal(t, "reserved:evt-1", got[0].Headers[sluice.EventIDKey])
	require.Eventually(t, func() bool { return s.count("outbox") == 0 && s.count("inbox") == 1 }, 2*time.Minute, 10*time.Millisecond)
	require.Equal(t, int64(2), runs.Load(), "the timed-out run and the tier's copy: Retry's re-run was refused")
	require.Zero(t, testenv.QueueDepth(t, s.conn, s.rabbit.Topology().Config().PoisonQueue))
}

// A foreign producer (Spring-like: AMQP properties, a typed header, a
// header that looks like Sluice's own) and a handler that copies what it
// received into what it produces: the relayed message carries the
// producer's properties and headers, not the forged retry history (the
// retry stage removed it on the way in). A produced message whose header is
// larger than the broker's frame is kept aside as unpublishable, and the
// other goes.
func TestTheOutboxRelaysAForeignProducersPropertiesAndKeepsAnOversizedMessageAside(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	h := func(msg *message.Message) ([]*message.Message, error) {
		copied := message.NewMessage(watermill.NewUUID(), msg.Payload)
		for k, v := range msg.Metadata {
			copied.Metadata.Set(k, v)
		}
		copied.Metadata.Set(sluice.EventIDKey, "copied:"+msg.Metadata.Get(sluice.EventIDKey))
		huge := message.NewMessage(watermill.NewUUID(), nil)
		huge.Metadata.Set("x-trace-dump", strings.Repeat("h", 200_000)) // over the 128 KiB frame
		return []*message.Message{copied, huge}, nil
	}
	s.run(h, nil, true)
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{RetryMin: time.Hour, RetryMax: time.Hour})

	ch, err := s.conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(t, ch.PublishWithContext(t.Context(), "", s.rabbit.Topology().Config().Queue, false, false, amqp.Publishing{
		ContentType: "application/json", CorrelationId: "corr-1", Type: "OrderPlaced", AppId: "spring-orders",
		DeliveryMode: amqp.Persistent, Body: []byte(`{"orderId":"o-1"}`),
		Headers: amqp.Table{"schemaVersion": int32(3), "__TypeId__": "com.example.OrderPlaced",
			sluice.EventIDKey: "evt-1", sluice.AttemptKey: "999"},
	}))
	got := s.producedMessages(1)
	require.Len(t, got, 1)
	d := got[0]
	require.Equal(t, "copied:evt-1", d.Headers[sluice.EventIDKey])
	require.Equal(t, "corr-1", d.CorrelationId)
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, "OrderPlaced", d.Type)
	require.Equal(t, "spring-orders", d.AppId)
	require.Equal(t, "com.example.OrderPlaced", d.Headers["__TypeId__"])
	require.Equal(t, "3", fmt.Sprint(d.Headers["schemaVersion"]))
	require.NotEqual(t, "999", d.Headers[sluice.AttemptKey], "the forged retry history is not carried on")
	require.Eventually(t, func() bool {
		return testenv.CounterWhere(t, s.meter, telemetry.MetricOutboxFailures, "error.type", "unpublishable") == 1
	}, 2*time.Minute, 10*time.Millisecond)
	require.Eventually(t, func() bool { return s.count("outbox") == 1 }, 2*time.Minute, 10*time.Millisecond, "the oversized one waits, with its error")
}
