package sluicesql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/replay/ledger"
)

// runsTable is the runs' table of the outcome table quoted (named name):
// <name>_runs in the same schema, cut short with a hash past 63 bytes.
func outcomesRunsTable(quoted, name string) string {
	runs := `"` + sqlname.Index(name, "_runs", "runs") + `"`
	if i := strings.LastIndex(quoted, `"."`); i >= 0 {
		return quoted[:i+2] + runs
	}
	return runs
}

func (s *Outcomes) createRuns(ctx context.Context, timestamp string) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.runs+` (
	id TEXT PRIMARY KEY,
	run TEXT NOT NULL,
	started_at `+timestamp+` NOT NULL,
	updated_at `+timestamp+` NOT NULL)`); err != nil {
		return fmt.Errorf("sluicesql: outcomes: creating %s: %w", s.runs, err)
	}
	index := `"` + sqlname.Index(s.name, "_runs_started_at", "rsa") + `"`
	_, err := s.db.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS `+index+` ON `+s.runs+` (started_at)`)
	return err
}

// SaveRun inserts or replaces the run of r.ID: one row, the run as JSON.
func (s *Outcomes) SaveRun(ctx context.Context, r ledger.Run) error {
	b, err := replayledger.MarshalRun(r)
	if err != nil {
		return err
	}
	q := s.db.Rebind(`INSERT INTO ` + s.runs + ` (id, run, started_at, updated_at) VALUES (?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET run = excluded.run, updated_at = excluded.updated_at`)
	_, err = s.db.ExecContext(ctx, q, r.ID, string(b), r.Started.UTC(), time.Now().UTC())
	return err
}

// Run returns the run of id.
func (s *Outcomes) Run(ctx context.Context, id string) (ledger.Run, bool, error) {
	var b string
	err := s.db.GetContext(ctx, &b, s.db.Rebind(`SELECT run FROM `+s.runs+` WHERE id = ?`), id)
	if errors.Is(err, sql.ErrNoRows) {
		return ledger.Run{}, false, nil
	}
	if err != nil {
		return ledger.Run{}, false, err
	}
	r, err := replayledger.UnmarshalRun(id, []byte(b))
	return r, err == nil, err
}

// RecentRuns returns the limit runs started last, newest first.
func (s *Outcomes) RecentRuns(ctx context.Context, limit int) ([]ledger.Run, error) {
	var rows []struct {
		ID  string `db:"id"`
		Run string `db:"run"`
	}
	if err := s.db.SelectContext(ctx, &rows, s.db.Rebind(`SELECT id, run FROM `+s.runs+` ORDER BY started_at DESC, id DESC LIMIT ?`), limit); err != nil {
		return nil, err
	}
	out := make([]ledger.Run, 0, len(rows))
	for _, row := range rows {
		r, err := replayledger.UnmarshalRun(row.ID, []byte(row.Run))
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
