package sluicesql_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/replay/replaytest"
	"github.com/sluicemq/sluice/sluicesql/sqlite"

	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/unitofwork"
)

// The SQL store passes the ledger conformance suite on PostgreSQL and
// SQLite.
func TestOutcomesConformance(t *testing.T) {
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
			s, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{})
			require.NoError(t, err)
			require.NoError(t, s.CreateTable(t.Context()))
			return s
		})
	})
}

func TestNewOutcomesValidates(t *testing.T) {
	t.Parallel()
	_, err := sluicesql.NewOutcomes(nil, sluicesql.OutcomesConfig{})
	require.ErrorContains(t, err, "NewOutcomes: the DB is required")
	_, err = sluicesql.NewOutcomes(testenv.SQLite(t), sluicesql.OutcomesConfig{Table: "replay; DROP TABLE x"})
	require.ErrorContains(t, err, "is not an SQL identifier")
}

// Outside an inbox's transaction RecordInUnitOfWork writes nothing and says
// so: replay.InTx then leaves the record to the stage.
func TestRecordInUnitOfWorkWithoutOne(t *testing.T) {
	t.Parallel()
	s, err := sluicesql.NewOutcomes(testenv.SQLite(t), sluicesql.OutcomesConfig{})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	err = s.RecordInUnitOfWork(t.Context(), replay.Record{Run: "r", Item: "a", Outcome: "processed"})
	require.ErrorIs(t, err, unitofwork.ErrMissing)
	rs, err := s.Outcomes(t.Context(), "")
	require.NoError(t, err)
	require.Empty(t, rs)
}

// The outcome table's updated_at is a timestamptz on PostgreSQL, as the
// inbox's processed_at, and CreateTable migrates a table an earlier version
// created with a timestamp without time zone, keeping its values (UTC).
// Before, the column stayed "timestamp without time zone".
func TestUpdatedAtIsATimestampWithTimeZone(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	table := testenv.Schema(t, db) + ".outcomes"
	_, err := db.ExecContext(t.Context(), `CREATE TABLE `+table+` (run TEXT NOT NULL, item TEXT NOT NULL,
		event_id TEXT NOT NULL DEFAULT '', outcome TEXT NOT NULL, class TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '',
		handler TEXT NOT NULL DEFAULT '', updated_at TIMESTAMP NOT NULL, PRIMARY KEY (run, item))`)
	require.NoError(t, err)
	_, err = db.ExecContext(t.Context(), `INSERT INTO `+table+` (run, item, outcome, updated_at) VALUES ('r', 'a', 'processed', '2026-11-30 10:00:00')`)
	require.NoError(t, err)
	s, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	require.NoError(t, s.CreateTable(t.Context()), "idempotent")
	var typ string
	require.NoError(t, db.GetContext(t.Context(), &typ, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'updated_at'`, table))
	require.Equal(t, "timestamp with time zone", typ)
	rs, err := s.Outcomes(t.Context(), "r")
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.True(t, rs[0].At.Equal(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)), "the old value, read as UTC: %s", rs[0].At)
}

// A plain *sql.DB wrapped with its driver's name (sqlx.NewDb) works for
// the outcome records as any *sqlx.DB; no database is refused.
func TestOutcomesOnAPlainSQLDB(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	stores, err := sluicesql.New(sqlx.NewDb(db.DB, "postgres"), sluicesql.Config{Schema: schema, Outcomes: sluicesql.OutcomesConfig{Table: "outcomes"}})
	require.NoError(t, err)
	s := stores.Outcomes
	require.NoError(t, s.CreateTable(t.Context()))
	require.NoError(t, s.Record(t.Context(), replay.Record{Run: "r", Item: "a", Outcome: "processed", At: time.Now()}))
	rs, err := s.Outcomes(t.Context(), "r")
	require.NoError(t, err)
	require.Len(t, rs, 1)
	_, err = sluicesql.NewOutcomes(nil, sluicesql.OutcomesConfig{})
	require.ErrorContains(t, err, "sluicesql: NewOutcomes: the DB is required (a plain *sql.DB: sqlx.NewDb(db, driverName))")
	wrapped, err := sluicesql.NewOutcomes(sqlx.NewDb(db.DB, "postgres"), sluicesql.OutcomesConfig{Table: schema + ".outcomes"})
	require.NoError(t, err)
	rs, err = wrapped.Outcomes(t.Context(), "r")
	require.NoError(t, err)
	require.Len(t, rs, 1)
}

// A sluicesql.Pruner given the outcome store deletes the records last
// updated before its retention, in bounded batches, and keeps the rest, on
// PostgreSQL and SQLite.
func TestPrunerDeletesOldOutcomes(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(t *testing.T) *sluicesql.Outcomes{
		"postgres": func(t *testing.T) *sluicesql.Outcomes {
			db := testenv.Postgres(t)
			return testenv.OutcomeStore(t, db, testenv.Schema(t, db)+".sluice_replay")
		},
		"sqlite": func(t *testing.T) *sluicesql.Outcomes { return testenv.OutcomeStore(t, testenv.SQLite(t), "") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			old := time.Now().Add(-48 * time.Hour)
			var rs []replay.Record
			for i := range 5 {
				rs = append(rs, replay.Record{Run: "old", Item: fmt.Sprint(i), Outcome: "processed", At: old})
			}
			rs = append(rs, replay.Record{Run: "new", Item: "a", Outcome: "processed", At: time.Now()})
			require.NoError(t, s.Records(t.Context(), rs))
			p, err := sluicesql.NewPruner(sluicesql.PrunerBatches(sluicesql.PrunerConfig{Store: s, Retention: 24 * time.Hour}, 2, time.Millisecond))
			require.NoError(t, err)
			n, err := p.Prune(t.Context())
			require.NoError(t, err)
			require.Equal(t, int64(5), n, "three batches of at most 2")
			left, err := s.Outcomes(t.Context(), "")
			require.NoError(t, err)
			require.Len(t, left, 1)
			require.Equal(t, "new", left[0].Run)
		})
	}
}
