package main

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicetest"
)

// newInventory runs the inventory handler on the test kit: the service's
// stages with their production defaults (the default ladder, 30s → 5m →
// 30m, on the kit's virtual clock), the inbox, outbox and the handler's
// tables in SQLite.
func newInventory(t testing.TB) *sluicetest.Harness {
	return sluicetest.New(t, sluicetest.Config{
		Handler: service.Handler{
			Name:              "inventory",
			Key:               sluice.KeyFromJSON("eventId"),
			PublishingHandler: (&inventory{}).reserve,
			PublishTopic:      rejectedTopic,
		},
		Setup: createTables,
	})
}

// createTables creates the example's tables in the kit's SQLite database.
func createTables(ctx context.Context, db *sqlx.DB) error {
	for _, stmt := range tables("").schema() {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func orderMsg(payload string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(payload))
}

func available(t testing.TB, h *sluicetest.Harness, sku string) int {
	var n int
	require.NoError(t, h.DB().Get(&n, `SELECT available FROM stock WHERE sku = ?`, sku))
	return n
}

// Each line of the example's script, as a handler test: what the inventory
// does with it, through the real stages.
func TestInventoryOnTheKit(t *testing.T) {
	t.Parallel()
	h := newInventory(t)
	h.Publish("new order", orderMsg(order("evt-1", "o-1", "book", 1, 0)))
	h.Publish("times out once", orderMsg(order("evt-3", "o-3", "lamp", 1, 1)))
	h.Publish("times out twice", orderMsg(order("evt-5", "o-5", "lamp", 1, 2)))
	h.Publish("out of stock", orderMsg(order("evt-4", "o-4", "piano", 1, 0)))
	h.Publish("malformed", orderMsg(`{"eventId":"evt-6","orderId":`))
	h.Publish("no such order", orderMsg(order("evt-7", "o-404", "book", 1, 0)))
	h.Settle()
	h.Redeliver("new order", "duplicate")
	h.Redeliver("out of stock", "duplicate of the rejected")
	h.Settle()

	h.RequireProcessedOnce("new order")
	h.RequireDuplicate("duplicate")
	h.RequireOutcomes("times out once", "retried to tier 1", "processed")
	h.RequireOutcomes("times out twice", "retried to tier 1", "retried to tier 2", "processed")
	require.Equal(t, 5*time.Minute+30*time.Second, h.Trace("times out twice").Last().At, "30s in tier 1, then 5m in tier 2")
	h.RequireRejected("out of stock")
	h.RequireProduced("out of stock", "rejected:evt-4")
	h.RequireDuplicate("duplicate of the rejected")
	h.RequirePoisoned("malformed", sluice.ClassPoison, nil)
	h.RequirePoisoned("no such order", sluice.ClassInvariant, map[string]string{
		metakeys.PoisonReason: "invariant: order o-404 must exist before its reservation",
	})
	require.Equal(t, 9, available(t, h, "book"), "o-1 reserved one book, once")
	require.Equal(t, 3, available(t, h, "lamp"))
}

// The stock service is down for longer than the whole ladder: the order
// is poisoned Exhausted after 35m30s of virtual time, its stock untouched.
func TestInventoryOutageOutlastsTheLadder(t *testing.T) {
	t.Parallel()
	h := newInventory(t)
	h.Publish("down", orderMsg(order("evt-1", "o-1", "book", 1, 99)))
	h.Settle()
	h.RequireOutcomes("down", "retried to tier 1", "retried to tier 2", "retried to tier 3", "poisoned (exhausted)")
	require.Equal(t, 35*time.Minute+30*time.Second, h.Trace("down").Last().At)
	require.Equal(t, 10, available(t, h, "book"))
}

// BenchmarkTheDefaultLadder runs an order through the whole default ladder
// — 30s, 5m and 30m of virtual time — and prints the real time it took.
func BenchmarkTheDefaultLadder(b *testing.B) {
	var total time.Duration
	for b.Loop() {
		h := newInventory(b)
		start := time.Now()
		h.Publish("recovers in tier 3", orderMsg(order("evt-1", "o-1", "book", 1, 3)))
		h.Settle()
		h.RequireOutcomes("recovers in tier 3", "retried to tier 1", "retried to tier 2", "retried to tier 3", "processed")
		total += time.Since(start)
		b.Logf("%s of virtual time in %s of real time", h.Now(), time.Since(start).Round(time.Millisecond))
		require.NoError(b, h.Shutdown())
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/ladder")
}
