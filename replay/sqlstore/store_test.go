package sqlstore_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/deduplication/sqlstore/sqlite"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/replay/replaytest"
	"github.com/sluicemq/sluice/replay/sqlstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The SQL store passes the ledger conformance suite on PostgreSQL and
// SQLite.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		replaytest.Run(t, func(t *testing.T) ledger.Ledger {
			db := testenv.Postgres(t)
			return testenv.OutcomeStore(t, db, testenv.Schema(t, db)+".sluice_replay")
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		replaytest.Run(t, func(t *testing.T) ledger.Ledger {
			db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "outcomes.db"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			s, err := sqlstore.New(sqlstore.Config{DB: db})
			require.NoError(t, err)
			require.NoError(t, s.CreateTable(t.Context()))
			return s
		})
	})
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := sqlstore.New(sqlstore.Config{})
	require.ErrorContains(t, err, "Config.DB is required")
	_, err = sqlstore.New(sqlstore.Config{DB: testenv.SQLite(t), Table: "replay; DROP TABLE x"})
	require.ErrorContains(t, err, "is not an SQL identifier")
}

// Outside an inbox's transaction RecordInUnitOfWork writes nothing and says
// so: replay.InTx then leaves the record to the stage.
func TestRecordInUnitOfWorkWithoutOne(t *testing.T) {
	t.Parallel()
	s, err := sqlstore.New(sqlstore.Config{DB: testenv.SQLite(t)})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	err = s.RecordInUnitOfWork(t.Context(), replay.Record{Run: "r", Item: "a", Outcome: "processed"})
	require.ErrorIs(t, err, replay.ErrNoUnitOfWork)
	rs, err := s.Outcomes(t.Context(), "")
	require.NoError(t, err)
	require.Empty(t, rs)
}
