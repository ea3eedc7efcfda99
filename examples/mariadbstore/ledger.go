package mariadbstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// Ledger keeps the replay stage's outcome records in a MariaDB/MySQL table
// beside the inbox, for `sluice dlq replay`'s closed loop: a ledger.Ledger
// written, like Store, on Sluice's public API only. It passes
// replaytest.Run. Unlike sluicesql.Outcomes' it does not write "processed" in
// the inbox's transaction (it is no replay.UnitOfWorkRecorder): outcomes
// are recorded after the stack returns, at least once.
type Ledger struct {
	db    *sql.DB
	table string
}

var _ ledger.Ledger = (*Ledger)(nil)

// NewLedger returns a ledger on table (default "sluice_replay") of db.
func NewLedger(db *sql.DB, table string) (*Ledger, error) {
	if db == nil {
		return nil, errors.New("mariadbstore: NewLedger needs a database")
	}
	if table == "" {
		table = ledger.TableDefault
	}
	if !identifier.MatchString(table) {
		return nil, fmt.Errorf("mariadbstore: ledger table %q is not an identifier", table)
	}
	return &Ledger{db: db, table: "`" + table + "`"}, nil
}

// CreateTable creates the table if it does not exist. Run and item are
// binary, like the inbox's keys: an item is exactly its bytes. The time is
// kept in microseconds, so no DSN option (parseTime) is needed to read it.
func (l *Ledger) CreateTable(ctx context.Context) error {
	_, err := l.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+l.table+` (
		run VARBINARY(128) NOT NULL, item VARBINARY(256) NOT NULL,
		event_id VARBINARY(512) NOT NULL DEFAULT '', outcome VARCHAR(32) NOT NULL,
		class VARCHAR(32) NOT NULL DEFAULT '', reason TEXT NOT NULL, handler VARCHAR(255) NOT NULL DEFAULT '',
		updated_us BIGINT NOT NULL,
		PRIMARY KEY (run, item)) ENGINE=InnoDB`)
	return err
}

// keep is true, in ON DUPLICATE KEY UPDATE, when the row there must stay:
// a committed outcome is final — nothing replaces processed or rejected, and
// only those replace duplicate (replaytest's CommittedIsFinal). MariaDB assigns left
// to right, a later assignment seeing the earlier ones: outcome, which keep
// reads, is assigned last, so every keep reads the row as it was. (VALUES()
// is MariaDB's; MySQL 8.0.20+ still takes it, deprecated.)
const keep = `(outcome IN ('processed', 'rejected') OR (outcome = 'duplicate' AND VALUES(outcome) NOT IN ('processed', 'rejected')))`

// Record upserts r; nothing replaces "processed" or "rejected", only those
// replace "duplicate", and an empty event id keeps the one there.
func (l *Ledger) Record(ctx context.Context, r replay.Record) error {
	_, err := l.db.ExecContext(ctx, `INSERT INTO `+l.table+` (run, item, event_id, outcome, class, reason, handler, updated_us)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE
		event_id = IF(`+keep+` OR VALUES(event_id) = '', event_id, VALUES(event_id)),
		class = IF(`+keep+`, class, VALUES(class)), reason = IF(`+keep+`, reason, VALUES(reason)),
		handler = IF(`+keep+`, handler, VALUES(handler)), updated_us = IF(`+keep+`, updated_us, VALUES(updated_us)),
		outcome = IF(`+keep+`, outcome, VALUES(outcome))`,
		r.Run, r.Item, r.EventID, string(r.Outcome), r.Class, r.Reason, r.Handler, r.At.UnixMicro())
	return err
}

// Replayed records that the CLI sent items of a run, unless an outcome for
// them is already there.
func (l *Ledger) Replayed(ctx context.Context, rs []replay.Record) error {
	for _, r := range rs {
		if _, err := l.db.ExecContext(ctx, `INSERT IGNORE INTO `+l.table+` (run, item, event_id, outcome, reason, updated_us)
			VALUES (?, ?, ?, ?, '', ?)`, r.Run, r.Item, r.EventID, string(ledger.OutcomeReplayed), r.At.UnixMicro()); err != nil {
			return err
		}
	}
	return nil
}

// Records inserts or replaces rs, the operator's records, keeping the event
// id and class there.
func (l *Ledger) Records(ctx context.Context, rs []replay.Record) error {
	for _, r := range rs {
		if _, err := l.db.ExecContext(ctx, `INSERT INTO `+l.table+` (run, item, event_id, outcome, class, reason, handler, updated_us)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE
			outcome = VALUES(outcome), reason = VALUES(reason), handler = VALUES(handler), updated_us = VALUES(updated_us)`,
			r.Run, r.Item, r.EventID, string(r.Outcome), r.Class, r.Reason, r.Handler, r.At.UnixMicro()); err != nil {
			return err
		}
	}
	return nil
}

const columns = `run, item, event_id, outcome, class, reason, handler, updated_us`

// Outcomes returns the records of run, or of every run when run is empty,
// ordered by run and item.
func (l *Ledger) Outcomes(ctx context.Context, run string) ([]replay.Record, error) {
	q, args := `SELECT `+columns+` FROM `+l.table, []any{}
	if run != "" {
		q, args = q+` WHERE run = ?`, append(args, run)
	}
	return l.query(ctx, q+` ORDER BY run, item`, args...)
}

// Items returns the records of run's items given, those there are, reading
// at most 500 items a query.
func (l *Ledger) Items(ctx context.Context, run string, items []string) ([]replay.Record, error) {
	var out []replay.Record
	for len(items) > 0 {
		chunk := items[:min(len(items), 500)]
		items = items[len(chunk):]
		args := []any{run}
		for _, it := range chunk {
			args = append(args, it)
		}
		rs, err := l.query(ctx, `SELECT `+columns+` FROM `+l.table+` WHERE run = ? AND item IN (?`+strings.Repeat(", ?", len(chunk)-1)+`)`, args...)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

func (l *Ledger) query(ctx context.Context, q string, args ...any) ([]replay.Record, error) {
	rows, err := l.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []replay.Record
	for rows.Next() {
		var r replay.Record
		var outcome string
		var us int64
		if err := rows.Scan(&r.Run, &r.Item, &r.EventID, &outcome, &r.Class, &r.Reason, &r.Handler, &us); err != nil {
			return nil, err
		}
		r.Outcome, r.At = sluice.Outcome(outcome), time.UnixMicro(us).UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}
