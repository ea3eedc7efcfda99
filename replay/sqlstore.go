package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/chunks"
	"github.com/sluicemq/sluice/internal/sqlname"
)

// TableDefault is the outcome table's default name.
const TableDefault = "sluice_replay"

// SQLStore keeps the records in a table of the inbox's database
// (PostgreSQL or SQLite; it registers no driver), one row per run and item.
// Safe for concurrent use.
type SQLStore struct {
	db    *sqlx.DB
	table string
}

var _ Ledger = (*SQLStore)(nil)

// NewSQLStore returns a store on table (name, or schema.name on PostgreSQL;
// default TableDefault). Create the table with CreateTable.
func NewSQLStore(db *sqlx.DB, table string) (*SQLStore, error) {
	if db == nil {
		return nil, errors.New("replay: NewSQLStore needs a database")
	}
	if table == "" {
		table = TableDefault
	}
	quoted, _, err := sqlname.Quote(table, true)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return &SQLStore{db: db, table: quoted}, nil
}

// CreateTable creates the table if it does not exist.
func (s *SQLStore) CreateTable(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.table+` (
	run TEXT NOT NULL,
	item TEXT NOT NULL,
	event_id TEXT NOT NULL DEFAULT '',
	outcome TEXT NOT NULL,
	class TEXT NOT NULL DEFAULT '',
	reason TEXT NOT NULL DEFAULT '',
	handler TEXT NOT NULL DEFAULT '',
	updated_at TIMESTAMP NOT NULL,
	PRIMARY KEY (run, item))`)
	return err
}

// Record upserts r by the stage's rule: a committed outcome is final —
// nothing replaces "processed" or "rejected", and only those replace
// "duplicate" (the event was processed before) — so a later delivery of a
// processed item (its ack lost, then failing before its claim) cannot record
// it retried, held or poisoned.
func (s *SQLStore) Record(ctx context.Context, r Record) error {
	return s.record(ctx, s.db, r)
}

// RecordTx is Record in tx (the inbox's transaction).
func (s *SQLStore) RecordTx(ctx context.Context, tx *sqlx.Tx, r Record) error {
	return s.record(ctx, tx, r)
}

func (s *SQLStore) record(ctx context.Context, db sqlx.ExtContext, r Record) error {
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
func (s *SQLStore) Replayed(ctx context.Context, rs []Record) error {
	q := s.db.Rebind(`INSERT INTO ` + s.table + ` (run, item, event_id, outcome, updated_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (run, item) DO NOTHING`)
	for _, r := range rs {
		if _, err := s.db.ExecContext(ctx, q, r.Run, r.Item, r.EventID, string(OutcomeReplayed), r.At.UTC()); err != nil {
			return err
		}
	}
	return nil
}

// Outcomes returns the records of run, or of every run when run is empty,
// ordered by run and item.
func (s *SQLStore) Outcomes(ctx context.Context, run string) ([]Record, error) {
	q := `SELECT run, item, event_id, outcome, class, reason, handler, updated_at FROM ` + s.table
	var args []any
	if run != "" {
		q += ` WHERE run = ?`
		args = append(args, run)
	}
	var out []Record
	err := s.db.SelectContext(ctx, &out, s.db.Rebind(q+` ORDER BY run, item`), args...)
	return out, err
}

// Items returns the records of run's items given, those there are.
func (s *SQLStore) Items(ctx context.Context, run string, items []string) ([]Record, error) {
	var out []Record
	err := chunks.Each(items, ItemsChunk, func(chunk []string) error {
		q, args, err := sqlx.In(`SELECT run, item, event_id, outcome, class, reason, handler, updated_at FROM `+s.table+
			` WHERE run = ? AND item IN (?)`, run, chunk)
		if err != nil {
			return err
		}
		var rs []Record
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
func (s *SQLStore) Records(ctx context.Context, rs []Record) error {
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

// Count returns how many of items (of run) have a final outcome, and how
// many of those were poisoned again.
func Count(rs []Record, items map[string]bool) (final, poisoned int) {
	for _, r := range rs {
		if items[r.Item] && Final(r.Outcome) {
			final++
			if r.Outcome == sluice.OutcomePoisoned {
				poisoned++
			}
		}
	}
	return final, poisoned
}
