package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The whole stack wired by hand runs as written (addStockByHand, the
// function docs/architecture.md shows): on RabbitMQ and PostgreSQL, an order is
// reserved once however often it is delivered, and a malformed one is
// isolated in stock.poison. Its tables live in a schema of the test's
// own (search_path); its queues are the function's and are deleted at the end.
func TestTheByHandStackRuns(t *testing.T) {
	db := testenv.PostgresInSchema(t)
	_, err := db.ExecContext(t.Context(), `CREATE TABLE reservations (order_id TEXT NOT NULL)`)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, "stock", "stock.retry.30s", "stock.retry.5m", "stock.retry.30m", "stock.poison")

	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	q, err := addStockByHand(t.Context(), r, testenv.AMQPURL, db)
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	closed := false
	closeAll := func() {
		if !closed {
			closed = true
			require.NoError(t, r.Close()) // drains what is in flight
			require.NoError(t, <-done)
			require.NoError(t, q.Close())
		}
	}
	t.Cleanup(closeAll)

	publish := func(payload string) {
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		require.NoError(t, q.Publisher().Publish("stock", m))
	}
	publish(`{"eventId":"evt-1","orderId":"o-1"}`)
	publish(`{"eventId":"evt-1","orderId":"o-1"}`) // the same event again
	publish(`{"eventId":"evt-2","orderId":`)       // malformed
	publish(`{"eventId":"evt-3","orderId":"o-3"}`)

	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, "stock.poison") == 1 },
		2*time.Minute, 20*time.Millisecond, "the malformed order is isolated in stock.poison")
	var orders []string
	require.Eventually(t, func() bool {
		orders = nil
		require.NoError(t, db.SelectContext(t.Context(), &orders, `SELECT order_id FROM reservations ORDER BY order_id`))
		return len(orders) == 2
	}, 2*time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, "stock") == 0 }, 2*time.Minute, 20*time.Millisecond)
	closeAll() // every delivery handed out is settled: the duplicate's too
	orders = nil
	require.NoError(t, db.SelectContext(t.Context(), &orders, `SELECT order_id FROM reservations ORDER BY order_id`))
	var claims int
	require.NoError(t, db.GetContext(t.Context(), &claims, `SELECT count(*) FROM sluice_inbox`))
	require.Equal(t, 2, claims, "one claim per event processed")
	require.Equal(t, []string{"o-1", "o-3"}, orders, "each order reserved once")
	poisoned := testenv.Drain(t, conn, "stock.poison")
	require.Len(t, poisoned, 1)
	require.Equal(t, "poison", poisoned[0].Headers["sluice_poison_class"])
}
