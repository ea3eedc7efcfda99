package deduplication_test

import (
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/deduplication/sqlstore/sqlite"
)

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(*testing.T) deduplication.Store { return deduplication.NewMemoryStore() })
}

func newSQLStore(t testing.TB, db *sqlx.DB, table string) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(sqlstore.Config{DB: db, Table: table})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	require.NoError(t, s.CreateTable(t.Context()), "CreateTable is idempotent")
	return s
}

func openSQLite(t testing.TB) *sqlx.DB {
	t.Helper()
	db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "inbox.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
