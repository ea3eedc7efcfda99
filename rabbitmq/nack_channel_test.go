package rabbitmq_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A nack takes the channel out of use: the next publish goes on a new
// channel (sluice.publish.reconnects "nacked"), the nack stays a certain failure,
// and messages confirmed on either channel are stored. A queue that is full
// (x-max-length 0, reject-publish) nacks every publish on one node; on a
// cluster a quorum queue's leader change does, and the channel that saw it
// went on nacking (TestClusterPublisherNodeKilledMidStream, in
// rabbitmq/internal/clustertest).
func TestPublisherNackMovesToANewChannel(t *testing.T) {
	t.Parallel()
	full := testenv.Name("pub_full")
	ch := testenv.Channel(t, testenv.AMQP(t))
	_, err := ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, full)
	open := declareQueue(t, "pub_open")

	reader := sdkmetric.NewManualReader()
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{
		Connection:     rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		ConfirmTimeout: 10 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	require.NoError(t, p.Publish(open, msgs(2)...))
	require.ErrorIs(t, p.Publish(full, msgs(1)...), rabbitmq.ErrNacked)
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricPublishReconnects), "nothing reopened before the next publish")
	require.NoError(t, p.Publish(open, msgs(3)...))
	require.Equal(t, int64(1), testenv.CounterWhere(t, reader, telemetry.MetricPublishReconnects, "sluice.reconnect", "nacked"))
	require.ErrorIs(t, p.Publish(full, msgs(1)...), rabbitmq.ErrNacked)
	require.NoError(t, p.Publish(open, msgs(1)...))
	require.Equal(t, int64(2), testenv.CounterSum(t, reader, telemetry.MetricPublishReconnects))
	require.Equal(t, 6, testenv.QueueDepth(t, testenv.AMQP(t), open))
}
