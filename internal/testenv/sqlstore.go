package testenv

import (
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

// SQLStore returns an SQL inbox store on db with its table created (twice:
// CreateTable is idempotent).
func SQLStore(t testing.TB, db *sqlx.DB, table string) *sluicesql.Inbox {
	t.Helper()
	s, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	require.NoError(t, s.CreateTable(t.Context()), "CreateTable is idempotent")
	return s
}

// SQLite opens a SQLite database file of t's own, closed when t ends.
func SQLite(t testing.TB) *sqlx.DB {
	t.Helper()
	db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "inbox.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// OutcomeStore returns a replay outcome store on db with its table created.
func OutcomeStore(t testing.TB, db *sqlx.DB, table string) *sluicesql.Outcomes {
	t.Helper()
	s, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	return s
}

// Migrate returns sluicesql's stores of cfg with their tables created by
// Stores.Migrate (twice: it is idempotent), in cfg.Schema when set.
func Migrate(t testing.TB, db *sqlx.DB, cfg sluicesql.Config) *sluicesql.Stores {
	t.Helper()
	s, err := sluicesql.New(db, cfg)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()))
	require.NoError(t, s.Migrate(t.Context()), "Migrate is idempotent")
	return s
}
