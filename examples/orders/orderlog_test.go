package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicetest"
)

// The order log on the test kit: a batch handler with the service's
// stages, its order_log table in SQLite. Each event is logged once — a
// copy redelivered later and a copy in the same batch alike — and an event
// whose payload the log cannot read is poisoned alone: the batch runs again
// without it and the others commit.
func TestOrderLogOnTheKit(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, sluicetest.Config{
		Handler: service.Handler{
			Name:         orderLogHandler,
			Key:          sluice.KeyFromJSON("eventId"),
			BatchHandler: &deduplication.BatchHandler{Handle: (&orderLog{}).record},
		},
		Setup: createTables,
	})
	h.Publish("new order", orderMsg(order("evt-1", "o-1", "book", 1, 0)))
	h.Publish("another", orderMsg(order("evt-2", "o-2", "lamp", 2, 0)))
	h.Publish("the same again, together", orderMsg(order("evt-2", "o-2", "lamp", 2, 0)))
	h.Publish("qty not a number", orderMsg(`{"eventId":"evt-9","orderId":"o-9","sku":"book","qty":"two"}`))
	h.Publish("malformed", orderMsg(`{"eventId":"evt-6","orderId":`))
	h.Settle()
	h.Redeliver("new order", "duplicate, later")
	h.Settle()

	h.RequireProcessedOnce("new order")
	h.RequireDuplicate("duplicate, later")
	// The two copies of evt-2 may share a batch: either is the one logged.
	both := append(h.Trace("another").Outcomes(), h.Trace("the same again, together").Outcomes()...)
	require.ElementsMatch(t, []string{"processed", "duplicate"}, both)
	h.RequirePoisoned("qty not a number", sluice.ClassPoison, nil)
	h.RequirePoisoned("malformed", sluice.ClassPoison, nil)

	var logged []string
	require.NoError(t, h.DB().Select(&logged, `SELECT event_id FROM order_log ORDER BY event_id`))
	require.Equal(t, []string{"evt-1", "evt-2"}, logged, "each event once; the poisoned ones rolled back")
}
