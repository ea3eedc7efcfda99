package deduplication_test

import (
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/internal/testenv"
)

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(*testing.T) deduplication.Store { return deduplication.NewMemoryStore() })
}

func TestPostgresStoreConformance(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		return newSQLStore(t, db, testenv.Schema(t, db)+".inbox")
	})
}

func TestSQLiteStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		return newSQLStore(t, openSQLite(t), "")
	})
}

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		client, prefix := testenv.Redis(t)
		s, err := deduplication.NewRedisStore(deduplication.RedisConfig{Client: client, Prefix: prefix})
		require.NoError(t, err)
		return s
	})
}

func newSQLStore(t testing.TB, db *sqlx.DB, table string) *deduplication.SQLStore {
	t.Helper()
	s, err := deduplication.NewSQLStore(deduplication.SQLConfig{DB: db, Table: table})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	require.NoError(t, s.CreateTable(t.Context()), "CreateTable is idempotent")
	return s
}

func openSQLite(t testing.TB) *sqlx.DB {
	t.Helper()
	db, err := deduplication.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "inbox.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
