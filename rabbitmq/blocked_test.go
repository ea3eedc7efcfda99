package rabbitmq_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A broker memory alarm blocks publishing connections: the broker stops
// reading from them. Publishers must not hang: each publish ends in an error
// within its confirm and write timeouts, later ones fail at once with
// ErrBlocked, and publishing resumes when the alarm clears. On a private
// node (plainNode, held alone meanwhile): the shared broker is never
// alarmed.
func TestPublisherBlockedConnectionIsBounded(t *testing.T) {
	t.Parallel()
	node := exclusiveNode(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: node.URL}, "")
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q := testenv.Name("blocked") // the node is shared: a queue of its own
	_, err = ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)

	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: node.URL, WriteTimeout: 2 * time.Second}, ConfirmTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer func() { _ = pub.Close() }()
	require.NoError(t, pub.Publish(q, msgs(1)...), "healthy before the alarm")

	node.Ctl(t, "set_vm_memory_high_watermark", "0.0000001")
	// Small and large publishes at once: the small ones wait for confirms
	// that do not come, the large ones for a socket the broker stopped
	// reading.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			m := message.NewMessage(watermill.NewUUID(), make([]byte, 16))
			if i%2 == 0 {
				m = message.NewMessage(watermill.NewUUID(), make([]byte, 16<<20))
			}
			errs <- pub.Publish(q, m)
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("publishers held by a blocked connection past their timeouts")
	}
	close(errs)
	for err := range errs {
		require.Error(t, err, "nothing is reported published while the broker refuses to read")
	}
	require.Eventually(t, func() bool {
		return errors.Is(pub.Publish(q, msgs(1)...), rabbitmq.ErrBlocked)
	}, time.Minute, 100*time.Millisecond, "once blocked, a publish fails at once with ErrBlocked")

	node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
	require.Eventually(t, func() bool { return pub.Publish(q, msgs(1)...) == nil }, 2*time.Minute, 200*time.Millisecond,
		"publishing resumes when the alarm clears")
}
