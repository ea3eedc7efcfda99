package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// The read of a queue's counts that `sluice queues` and the console's
// start-up make (row), and `dlq replay`'s of its depth (queueDepth), on a
// broker that went silent after the handshake give up after
// dlq.CallTimeout; before, they waited for the AMQP heartbeat to give the
// connection up — on a connection without heartbeats, for ever.
func TestABlackHoledBrokerHoldsNoQueueRowPastCallTimeout(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	conn, err := rabbitmq.Dial(rabbitmq.DialConfig{Connection: rabbitmq.Connection{URL: url + "?heartbeat=0"}, Name: "cli black hole"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = amqpcall.Close(conn, time.Second) })
	proxy.BlackHole()
	q := testenv.Name("cli_holed")

	done := make(chan queueRow, 1)
	start := time.Now()
	go func() { done <- row(conn, q, q, "main") }()
	select {
	case r := <-done:
		require.True(t, r.Missing, "not read")
	case <-time.After(dlq.CallTimeout + 25*time.Second):
		t.Fatalf("row did not return within %s", dlq.CallTimeout+25*time.Second)
	}
	require.Less(t, time.Since(start), dlq.CallTimeout+10*time.Second)
	start = time.Now()
	require.Zero(t, queueDepth(conn, q))
	require.Less(t, time.Since(start), time.Second, "the connection was closed under the first: at once")
}
