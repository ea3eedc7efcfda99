package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/sluicesql"
)

// Issue 28.6: relay A hangs while it holds a batch — its link to
// PostgreSQL stalled (as a SIGSTOP'ed process's is: nothing comes from it,
// its connection stays open). The batch's hold is bounded by A's publish
// and store timeouts (its transaction's idle_in_transaction_session_timeout),
// so healthy relay B takes the rows. Before, A's transaction turned that
// timeout off, and B could not take them for as long as A hung.
func TestAHungRelayHoldsItsBatchOnlyForItsTimeouts(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	proxy, viaProxy := testenv.ProxyPostgres(t)
	storeA, err := sluicesql.NewOutbox(viaProxy, sluicesql.OutboxConfig{Table: s.schema + ".outbox"})
	require.NoError(t, err)

	const n = 50
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
	}
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, msgs...))
	require.NoError(t, tx.Commit())

	pubA := &holding{pub: s.rabbit.Publisher(), started: make(chan struct{}), release: make(chan struct{})}
	// A's StoreTimeout is long enough for its Due (a dial through the
	// proxy and five statements) on a loaded machine: a call given up
	// loses its connection, and the next one dials again.
	relayA, err := outbox.NewRelay(storeA, pubA, outbox.RelayConfig{StatsInterval: -1,
		Env: sluice.Env{PublishTimeout: time.Second, StoreTimeout: 3 * time.Second}, PollInterval: time.Hour})
	require.NoError(t, err)
	doneA := make(chan error, 1)
	go func() { doneA <- relayA.Run(context.Background()) }()
	<-pubA.started // A holds the batch
	proxy.BlackHole()
	t.Cleanup(func() {
		proxy.Heal()
		require.NoError(t, relayA.Close())
		require.NoError(t, <-doneA)
	})
	close(pubA.release) // A's publishes go on; its delete never reaches the database

	start := time.Now()
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{PollInterval: 20 * time.Millisecond, StatsInterval: -1})
	// Nothing moves for A's hold (10 s), less than AwaitCount's minute.
	require.NoError(t, testenv.AwaitCount(n, time.Minute, 10*time.Minute, func() int { return n - s.count("outbox") }),
		"B takes and publishes the rows A held")
	t.Logf("B had the rows after %s (A's hold: PublishTimeout 1 s + 3 × StoreTimeout 3 s)", time.Since(start))
	require.GreaterOrEqual(t, testenv.QueueDepth(t, s.conn, s.produced), n)
}
