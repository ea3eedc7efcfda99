package deduplicationtest_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

// A store's own test runs the suite as a third party writes it, on the
// public API only: the function gives each call a store of its own — here
// a fresh SQLite file; for a server, a fresh table, key prefix or database.
// (An Example cannot run the suite: it needs the *testing.T of a test.)
func TestSQLiteStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "inbox.db"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{})
		require.NoError(t, err)
		require.NoError(t, store.CreateTable(t.Context()))
		return store
	})
}
