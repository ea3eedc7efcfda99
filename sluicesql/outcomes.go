package sluicesql

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/internal/chunks"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/unitofwork"
)

// outcomesTableDefault is the outcome table's default name
// (OutcomesConfig.Table's).
const outcomesTableDefault = ledger.TableDefault

// OutcomesConfig configures NewOutcomes. Every field is optional.
type OutcomesConfig struct {
	// Table is the outcome table: a name, or schema.name on PostgreSQL,
	// each part an SQL identifier. It is quoted, so case matters. Default
	// "sluice_replay" (ledger.TableDefault).
	Table string
}

// Outcomes keeps the replay stage's outcome records in a table of the
// inbox's database (PostgreSQL or SQLite), one row per run and item, for
// `sluice dlq replay`'s closed loop and `sluice dlq report`, and the runs
// in <table>_runs (ledger.Runs). On the inbox's database it records
// "processed" in the inbox's transaction (replay.Config.InUnitOfWork). A
// Pruner given it deletes its old records (DeleteBefore). Its
// Redis twin is sluiceredis.Outcomes. Safe for concurrent use.
type Outcomes struct {
	db    *sqlx.DB
	table string // quoted
	name  string // the last part, unquoted, for the index's name
	runs  string // the runs' table, quoted: <table>_runs (outcomes_runs.go)
}

var (
	_ ledger.Ledger             = (*Outcomes)(nil)
	_ ledger.Runs               = (*Outcomes)(nil)
	_ replay.UnitOfWorkRecorder = (*Outcomes)(nil)
	_                           = PrunerConfig{Store: (*Outcomes)(nil)}
)

// NewOutcomes validates cfg and returns the outcome table on db, the
// inbox's database for replay.Config.InUnitOfWork: PostgreSQL or SQLite (a
// plain *sql.DB: sqlx.NewDb(db, driverName)). It does not touch the
// database: CreateTable or Stores.Migrate creates the tables. New builds one
// (Stores.Outcomes).
func NewOutcomes(db *sqlx.DB, cfg OutcomesConfig) (*Outcomes, error) {
	if db == nil {
		return nil, errNoDB("NewOutcomes")
	}
	quoted, name, err := sqlname.Quote(cmp.Or(cfg.Table, outcomesTableDefault), true)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: OutcomesConfig.Table: %w", err)
	}
	return &Outcomes{db: db, table: quoted, name: name, runs: outcomesRunsTable(quoted, name)}, nil
}

func (s *Outcomes) postgres() bool {
	return s.db.DriverName() == "postgres" || s.db.DriverName() == "pgx"
}

// CreateTable creates the table and its index on updated_at (which
// DeleteBefore reads), and the runs' table (<table>_runs: ledger.Runs), if
// they do not exist: Stores.Migrate runs it, with the other tables; alone,
// it creates the outcome records on a database of their own (`sluice dlq
// --outcomes`). On PostgreSQL, updated_at is a
// timestamptz, as the inbox's processed_at: a table an earlier version
// created with a timestamp without time zone (holding UTC, which Sluice
// always wrote) is altered to it, its values kept.
func (s *Outcomes) CreateTable(ctx context.Context) error {
	postgres := s.postgres()
	timestamp := "TIMESTAMP" // SQLite: the declared type its drivers read back as a time
	if postgres {
		timestamp = "TIMESTAMPTZ"
	}
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.table+` (
	run TEXT NOT NULL,
	item TEXT NOT NULL,
	event_id TEXT NOT NULL DEFAULT '',
	outcome TEXT NOT NULL,
	class TEXT NOT NULL DEFAULT '',
	reason TEXT NOT NULL DEFAULT '',
	handler TEXT NOT NULL DEFAULT '',
	updated_at `+timestamp+` NOT NULL,
	PRIMARY KEY (run, item))`); err != nil {
		return err
	}
	index := `"` + sqlname.Index(s.name, "_updated_at", "uat") + `"`
	if _, err := s.db.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS `+index+` ON `+s.table+` (updated_at)`); err != nil {
		return err
	}
	if err := s.createRuns(ctx, timestamp); err != nil {
		return err
	}
	if !postgres {
		return nil
	}
	var typ string
	if err := s.db.GetContext(ctx, &typ, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
	WHERE attrelid = $1::regclass AND attname = 'updated_at' AND NOT attisdropped`, s.table); err != nil {
		return fmt.Errorf("sluicesql: outcomes: reading the type of %s.updated_at: %w", s.table, err)
	}
	if typ != "timestamp without time zone" {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `ALTER TABLE `+s.table+` ALTER COLUMN updated_at TYPE TIMESTAMPTZ USING updated_at AT TIME ZONE 'UTC'`)
	return err
}

// Record upserts r by the stage's rule: a committed outcome is final —
// nothing replaces "processed" or "rejected", and only those replace
// "duplicate" (the event was processed before) — so a later delivery of a
// processed item (its ack lost, then failing before its claim) cannot record
// it retried, held or poisoned.
func (s *Outcomes) Record(ctx context.Context, r replay.Record) error {
	return s.record(ctx, s.db, r)
}

// RecordInUnitOfWork is Record in the inbox's transaction that ctx carries
// (sluicesql.TxFromContext), for replay.InTx: the table must
// be in the inbox's database. Outside an SQL inbox's transaction it returns
// unitofwork.ErrMissing and writes nothing.
func (s *Outcomes) RecordInUnitOfWork(ctx context.Context, r replay.Record) error {
	tx := TxFromContext(ctx)
	if tx == nil {
		return unitofwork.ErrMissing
	}
	return s.record(ctx, tx, r)
}

func (s *Outcomes) record(ctx context.Context, db sqlx.ExtContext, r replay.Record) error {
	q := db.Rebind(`INSERT INTO ` + s.table + ` AS t (run, item, event_id, outcome, class, reason, handler, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run, item) DO UPDATE SET outcome = excluded.outcome, class = excluded.class, reason = excluded.reason,
	handler = excluded.handler, updated_at = excluded.updated_at,
	event_id = CASE WHEN excluded.event_id = '' THEN t.event_id ELSE excluded.event_id END
WHERE NOT (t.outcome IN ('processed', 'rejected')
	OR (t.outcome = 'duplicate' AND excluded.outcome NOT IN ('processed', 'rejected')))`)
	_, err := db.ExecContext(ctx, q, r.Run, r.Item, r.EventID, string(r.Outcome), r.Class, r.Reason, r.Handler, r.At.UTC())
	return err
}

// Replayed records that the CLI sent items of run, unless an outcome for
// them is already there.
func (s *Outcomes) Replayed(ctx context.Context, rs []replay.Record) error {
	q := s.db.Rebind(`INSERT INTO ` + s.table + ` (run, item, event_id, outcome, updated_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (run, item) DO NOTHING`)
	for _, r := range rs {
		if _, err := s.db.ExecContext(ctx, q, r.Run, r.Item, r.EventID, string(ledger.OutcomeReplayed), r.At.UTC()); err != nil {
			return err
		}
	}
	return nil
}

// Outcomes returns the records of run, or of every run when run is empty,
// ordered by run and item.
func (s *Outcomes) Outcomes(ctx context.Context, run string) ([]replay.Record, error) {
	q := `SELECT run, item, event_id, outcome, class, reason, handler, updated_at FROM ` + s.table
	var args []any
	if run != "" {
		q += ` WHERE run = ?`
		args = append(args, run)
	}
	var out []replay.Record
	err := s.db.SelectContext(ctx, &out, s.db.Rebind(q+` ORDER BY run, item`), args...)
	return out, err
}

// Items returns the records of run's items given, those there are.
func (s *Outcomes) Items(ctx context.Context, run string, items []string) ([]replay.Record, error) {
	var out []replay.Record
	err := chunks.Each(items, replayledger.ItemsChunk, func(chunk []string) error {
		q, args, err := sqlx.In(`SELECT run, item, event_id, outcome, class, reason, handler, updated_at FROM `+s.table+
			` WHERE run = ? AND item IN (?)`, run, chunk)
		if err != nil {
			return err
		}
		var rs []replay.Record
		if err := s.db.SelectContext(ctx, &rs, s.db.Rebind(q), args...); err != nil {
			return err
		}
		out = append(out, rs...)
		return nil
	})
	return out, err
}

// Records inserts or replaces rs: the operator's records (archived,
// discarded, compensated), which replace whatever was there.
func (s *Outcomes) Records(ctx context.Context, rs []replay.Record) error {
	q := s.db.Rebind(`INSERT INTO ` + s.table + ` (run, item, event_id, outcome, class, reason, handler, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run, item) DO UPDATE SET outcome = excluded.outcome, reason = excluded.reason,
	handler = excluded.handler, updated_at = excluded.updated_at`)
	for _, r := range rs {
		if _, err := s.db.ExecContext(ctx, q, r.Run, r.Item, r.EventID, string(r.Outcome), r.Class, r.Reason, r.Handler, r.At.UTC()); err != nil {
			return err
		}
	}
	return nil
}

// DeleteBefore deletes at most limit records last updated before t (and
// at most limit runs last saved before t) and returns how many it deleted: a sluicesql.Pruner given this store
// prunes the outcome table in bounded batches. A run's report (sluice dlq
// report) lists only the records still there.
func (s *Outcomes) DeleteBefore(ctx context.Context, t time.Time, limit int) (int64, error) {
	n, err := s.deleteBefore(ctx, s.table, t, limit)
	if err != nil {
		return n, err
	}
	runs, err := s.deleteBefore(ctx, s.runs, t, limit)
	return n + runs, err
}

// deleteBefore deletes at most limit rows of table last updated before t.
func (s *Outcomes) deleteBefore(ctx context.Context, table string, t time.Time, limit int) (int64, error) {
	q := `DELETE FROM ` + table + ` WHERE rowid IN (SELECT rowid FROM ` + table + ` WHERE updated_at < ? LIMIT ?)`
	if s.postgres() {
		q = `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + table + ` WHERE updated_at < $1 LIMIT $2))`
	}
	res, err := s.db.ExecContext(ctx, q, t.UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("sluicesql: outcomes: pruning %s: %w", table, err)
	}
	return res.RowsAffected()
}
