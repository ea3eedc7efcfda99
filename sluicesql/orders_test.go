package sluicesql_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering/orderingtest"

	"github.com/sluicemq/sluice/sluicesql"
)

// The PostgreSQL store passes the conformance suite: row locks bounded by
// the context, holds in order and once, metadata byte for byte.
func TestOrdersConform(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	s, err := sluicesql.NewOrders(db, sluicesql.OrdersConfig{TablePrefix: testenv.Schema(t, db) + ".sluice_order"})
	require.NoError(t, err)
	require.NoError(t, sluicesql.CreateOrdersTables(t.Context(), s))
	orderingtest.Run(t, s, "ledger")
}

func TestNewOrdersValidates(t *testing.T) {
	t.Parallel()
	_, err := sluicesql.NewOrders(nil, sluicesql.OrdersConfig{})
	require.ErrorContains(t, err, "sluicesql: NewOrders: the DB is required")
	db := testenv.Postgres(t)
	_, err = sluicesql.NewOrders(db, sluicesql.OrdersConfig{TablePrefix: "bad-name"})
	require.ErrorContains(t, err, "TablePrefix")
	_, err = sluicesql.NewOrders(db, sluicesql.OrdersConfig{IdleTimeout: -time.Second})
	require.ErrorContains(t, err, "OrdersConfig.IdleTimeout")
	sqlite := testenv.SQLite(t)
	_, err = sluicesql.NewOrders(sqlite, sluicesql.OrdersConfig{})
	require.ErrorContains(t, err, "want postgres or pgx")
}

// Issue 43, item 3: a key's unit of work limits its own idle time: once it
// idles past IdleTimeout (its process hung), PostgreSQL ends it and another
// Lock of the key gets the key at once.
func TestAnIdleUnitOfWorkFreesItsKey(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	s, err := sluicesql.NewOrders(db, sluicesql.OrdersConfig{TablePrefix: testenv.Schema(t, db) + ".sluice_order", IdleTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sluicesql.CreateOrdersTables(t.Context(), s))
	g, err := s.Lock(t.Context(), "ledger", "acct-1")
	require.NoError(t, err)
	require.NoError(t, g.Block(t.Context(), "e-1", false, "to a tier"))
	require.NoError(t, g.Commit(t.Context()))
	hung, err := s.Lock(t.Context(), "ledger", "acct-1")
	require.NoError(t, err)
	require.NoError(t, hung.Unblock(t.Context()), "a release begins")
	t.Cleanup(func() { _ = hung.Rollback(t.Context()) })
	// hung says nothing more, as a stopped process's unit of work.
	next, err := s.Lock(t.Context(), "ledger", "acct-1")
	require.NoError(t, err, "the key is free once PostgreSQL ended the idle unit of work (LockTimeout 5 s)")
	defer func() { _ = next.Rollback(t.Context()) }()
	st, waiting, err := next.State(t.Context())
	require.NoError(t, err)
	require.True(t, waiting)
	require.Equal(t, "e-1", st.Head, "the hung unit of work's unblock was rolled back with it")
	require.Error(t, hung.Commit(t.Context()), "it was ended")
}
