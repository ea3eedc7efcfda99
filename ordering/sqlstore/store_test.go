package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering/orderingtest"
	"github.com/sluicemq/sluice/ordering/sqlstore"
)

// The PostgreSQL store passes the conformance suite: row locks bounded by
// the context, holds in order and once, metadata byte for byte.
func TestStoreConforms(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	s, err := sqlstore.New(sqlstore.Config{DB: db, TablePrefix: testenv.Schema(t, db) + ".sluice_order"})
	require.NoError(t, err)
	require.NoError(t, s.CreateTables(t.Context()))
	orderingtest.Run(t, s, "ledger")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := sqlstore.New(sqlstore.Config{})
	require.Error(t, err)
	db := testenv.Postgres(t)
	_, err = sqlstore.New(sqlstore.Config{DB: db, TablePrefix: "bad-name"})
	require.ErrorContains(t, err, "TablePrefix")
	sqlite := testenv.SQLite(t)
	_, err = sqlstore.New(sqlstore.Config{DB: sqlite})
	require.ErrorContains(t, err, "want postgres or pgx")
}
