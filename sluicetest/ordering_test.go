package sluicetest_test

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicetest"
)

// An ordered handler (service.Handler.OrderBy) runs on the kit: a payment
// of account a that times out once waits in the first tier, the account's
// later payments are held behind it and run after it, in order, each once;
// account b flows. Each held payment's trace says it waited, then ran.
// On SQLite the kit holds them in memory; on PostgreSQL in the service's
// ordering tables.
func TestAnOrderedHandlerOnTheKit(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		orderedOnTheKit(t, nil)
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		orderedOnTheKit(t, testenv.PostgresInSchema(t))
	})
}

func orderedOnTheKit(t *testing.T, db *sqlx.DB) {
	h := newHarness(t, sluicetest.Config{DB: db, Handler: service.Handler{OrderBy: sluice.KeyFromMetadata("account")}})
	for _, p := range []struct {
		subject, id, account string
		fail                 payment
	}{
		{"a first", "a-1", "a", payment{Fail: "transient", Attempts: 1}},
		{"a second", "a-2", "a", payment{}},
		{"b first", "b-1", "b", payment{}},
		{"a third", "a-3", "a", payment{}},
	} {
		m := pay(p.id, p.fail)
		m.Metadata.Set("account", p.account)
		h.Publish(p.subject, m)
	}
	h.Settle()
	h.RequireOutcomes("a first", "retried to tier 1", "processed, produced receipt:a-1")
	h.RequireOutcomes("a second", "waiting", "processed, produced receipt:a-2")
	h.RequireOutcomes("a third", "waiting", "processed, produced receipt:a-3")
	h.RequireOutcomes("b first", "processed, produced receipt:b-1")
	var ids []string
	order := "rowid" // SQLite: the order of the inserts
	if h.DB().DriverName() == "postgres" {
		order = "xmin::text::bigint" // the inserting transactions', one per payment
	}
	require.NoError(t, h.DB().Select(&ids, `SELECT event_id FROM payments WHERE event_id LIKE 'a-%' ORDER BY `+order))
	require.Equal(t, []string{"a-1", "a-2", "a-3"}, ids, "account a's payments in publish order")
}
