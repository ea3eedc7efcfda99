package router_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// A poisoned copy read back from RabbitMQ carries, as AMQP headers, every
// header of poison.Diagnosis, the list docs/poison.md's table documents
// (poison's TestThePoisonedCopyCarriesTheDocumentedHeaders checks the
// table against it): nothing documented is missing from the copy. The docs used to list
// sluice_poison_attempts and sluice_poison_first_failed_at, which no copy
// carried.
func TestARealPoisonCopyCarriesEveryDocumentedHeader(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("diagnosis")
	q := newRabbitMQ(t, queue, 100*time.Millisecond)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "diagnosis",
		Handler: func(*message.Message) error {
			return sluice.Transient(errors.New("the ledger is down")) // spends the ladder: exhausted
		},
		Stages: router.Stages{Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{}},
	})
	require.NoError(t, err)
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-diagnosis")
	m.Metadata.Set(sluice.EventTypeKey, "order.created")
	m.Metadata.Set(sluice.TraceparentKey, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	require.NoError(t, q.Publisher().Publish(queue, m))
	runRouter(t, r)

	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue) == 1 }, 2*time.Minute, 10*time.Millisecond)
	copies := testenv.Drain(t, conn, q.Topology().Config().PoisonQueue)
	require.Len(t, copies, 1)
	h := copies[0].Headers
	for _, k := range poison.Diagnosis() {
		v, ok := h[k]
		require.True(t, ok, "the documented header %s is not on the copy (its headers: %v)", k, h)
		if k != metakeys.PoisonExchange { // "": the default exchange the broker publishes to
			require.NotEmpty(t, v, "the documented header %s is empty", k)
		}
	}
	require.Equal(t, "exhausted", h[metakeys.PoisonClass])
	require.Equal(t, "evt-diagnosis", h[sluice.EventIDKey])
	require.Equal(t, "order.created", h[sluice.EventTypeKey])
}
