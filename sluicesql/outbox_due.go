package sluicesql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/outbox"
)

// Due takes up to limit due rows, oldest first, and after the first up to
// maxBytes of payload and metadata (0: no bound) — the rows' sizes are
// read first, their contents only for the rows taken (outbox.Store). On
// PostgreSQL it holds them with FOR UPDATE SKIP LOCKED in a transaction
// that lives until the batch is finished or released, or ctx ends; on
// SQLite it leases them until ctx ends (the relay's batch: its
// PublishTimeout plus three StoreTimeouts), 2 min when ctx has no
// deadline, after which another relay takes them, should this one have
// stopped.
func (s *Outbox) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	if s.dialect.name == "postgres" {
		return s.duePostgres(ctx, limit, maxBytes)
	}
	return s.dueSQLite(ctx, limit, maxBytes)
}

// outboxSized is a due row's id and bytes.
type outboxSized struct {
	ID    int64 `db:"id"`
	Bytes int64 `db:"bytes"`
}

// outboxWithin returns the ids of rows up to maxBytes (at least one).
func outboxWithin(rs []outboxSized, maxBytes int64) []int64 {
	ids := make([]int64, 0, len(rs))
	var total int64
	for _, r := range rs {
		total += r.Bytes
		if len(ids) > 0 && maxBytes > 0 && total > maxBytes {
			break
		}
		ids = append(ids, r.ID)
	}
	return ids
}

// outboxScanned is a row as selected.
type outboxScanned struct {
	ID        int64    `db:"id"`
	Topic     string   `db:"topic"`
	MessageID string   `db:"message_id"`
	Metadata  []byte   `db:"metadata"`
	Payload   []byte   `db:"payload"`
	Attempts  int      `db:"attempts"`
	Created   any      `db:"created_at"`
	Age       *float64 `db:"age"` // seconds, on the database's clock (PostgreSQL)
}

// decode reads the rows back; one that cannot be (its metadata altered by
// hand, say) carries its Err, for the relay to keep aside: it never stops
// the rest.
func (s *Outbox) decode(rs []outboxScanned) []outbox.Row {
	out := make([]outbox.Row, 0, len(rs))
	for _, r := range rs {
		row := outbox.Row{ID: r.ID, Topic: r.Topic, Attempts: r.Attempts}
		md, err := outboxDecode(r.Metadata)
		if err != nil {
			row.Err = fmt.Errorf("sluicesql: outbox: row %d of %s: its metadata: %w", r.ID, s.table, err)
		}
		row.Message = message.NewMessage(r.MessageID, r.Payload)
		row.Message.Metadata = md
		row.CreatedAt, err = s.dialect.readTime(r.Created)
		if err != nil && row.Err == nil {
			row.Err = fmt.Errorf("sluicesql: outbox: row %d of %s: %w", r.ID, s.table, err)
		}
		row.Age = outboxAge(r.Age, row.CreatedAt)
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b outbox.Row) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

const outboxColumns = `id, topic, message_id, metadata, payload, attempts, created_at`

// outboxAge is seconds read on the database's clock, or, on SQLite (whose clock
// is the process's), the time since created.
func outboxAge(seconds *float64, created time.Time) time.Duration {
	if seconds != nil {
		return max(time.Duration(*seconds*float64(time.Second)), 0)
	}
	if created.IsZero() {
		return 0
	}
	return max(time.Since(created), 0)
}

// The bounds of a batch's hold on PostgreSQL when Due's context has no
// deadline (the relay's always has one), and at least.
const (
	outboxHoldMax = 5 * time.Minute
	outboxHoldMin = time.Second
)

func (s *Outbox) duePostgres(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: outbox: begin: %w", err)
	}
	// The transaction is idle while the batch is published: a server-wide
	// idle_in_transaction_session_timeout shorter than the publishes would
	// end it after them, and the rows would be sent again and again. Nor is
	// it turned off: a relay that hangs (stopped, its link stalled) would
	// hold the rows from every other relay for as long as it hangs. The
	// batch's life (ctx's deadline: the relay's PublishTimeout and
	// StoreTimeouts) bounds both the idle time and each statement.
	hold := outboxHoldMax
	if d, ok := ctx.Deadline(); ok {
		hold = min(max(time.Until(d), outboxHoldMin), outboxHoldMax)
	}
	for _, name := range []string{"idle_in_transaction_session_timeout", "statement_timeout"} {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL %s = %d`, name, hold.Milliseconds())); err != nil {
			_ = tx.Rollback()
			return nil, fmt.Errorf("sluicesql: outbox: %w", err)
		}
	}
	// The sizes first: the rows locked beyond maxBytes are left untouched
	// and released with the batch.
	var sizes []outboxSized
	q := `SELECT id, octet_length(payload) + octet_length(metadata) AS bytes FROM ` + s.table +
		` WHERE dead_at IS NULL AND next_attempt_at <= clock_timestamp() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	if err := tx.SelectContext(ctx, &sizes, q, limit); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("sluicesql: outbox: reading due rows of %s: %w", s.table, err)
	}
	var rs []outboxScanned
	ids := outboxWithin(sizes, maxBytes)
	if len(ids) > 0 {
		q, args, err := sqlx.In(`SELECT `+outboxColumns+`, EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8 AS age FROM `+s.table+` WHERE id IN (?)`, ids)
		if err == nil {
			err = tx.SelectContext(ctx, &rs, tx.Rebind(q), args...)
		}
		if err != nil {
			_ = tx.Rollback()
			return nil, fmt.Errorf("sluicesql: outbox: reading due rows of %s: %w", s.table, err)
		}
	}
	return &outboxPGBatch{s: s, tx: tx, rows: s.decode(rs), cut: len(ids) < len(sizes)}, nil
}

type outboxPGBatch struct {
	s    *Outbox
	tx   *sqlx.Tx
	rows []outbox.Row
	cut  bool // maxBytes left due rows out
}

func (b *outboxPGBatch) Rows() []outbox.Row { return b.rows }

func (b *outboxPGBatch) CutShort() bool { return b.cut }

func (b *outboxPGBatch) Finish(ctx context.Context, relayed []int64, failed []outbox.Failed) error {
	if err := b.s.finish(ctx, b.tx, relayed, failed); err != nil {
		_ = b.tx.Rollback()
		return err
	}
	if err := b.tx.Commit(); err != nil {
		return fmt.Errorf("sluicesql: outbox: commit: %w", err)
	}
	return nil
}

func (b *outboxPGBatch) Release(context.Context) error {
	if err := b.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// finish deletes the relayed rows and records the failed ones in db.
func (s *Outbox) finish(ctx context.Context, db sqlx.ExtContext, relayed []int64, failed []outbox.Failed) error {
	for chunk := range slices.Chunk(relayed, 1000) {
		q, args, err := sqlx.In(`DELETE FROM `+s.table+` WHERE id IN (?)`, chunk)
		if err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, db.Rebind(q), args...); err != nil {
			return fmt.Errorf("sluicesql: outbox: deleting %d relayed rows of %s: %w", len(chunk), s.table, err)
		}
	}
	// The wait, not the relay's clock: Due compares with the database's.
	// An uncounted failure (no broker answered; given back untried) adds
	// no attempt: MaxAttempts counts the broker's refusals only. Rows that
	// failed alike (an outage fails a whole batch with one error, due again
	// at once) are recorded by one statement, not one each.
	q := `UPDATE ` + s.table + ` SET attempts = attempts + ?, last_error = ?, next_attempt_at = ` + s.dialect.after + s.dialect.unlease + ` WHERE id IN (?)`
	dead := `UPDATE ` + s.table + ` SET attempts = attempts + 1, last_error = ?, dead_at = ` + s.dialect.now + s.dialect.unlease + ` WHERE id IN (?)`
	for _, g := range alike(failed) {
		for chunk := range slices.Chunk(g.ids, 1000) {
			var stmt string
			var args []any
			var err error
			if g.Dead {
				stmt, args, err = sqlx.In(dead, g.Err, chunk)
			} else {
				counted := 1
				if g.Uncounted {
					counted = 0
				}
				stmt, args, err = sqlx.In(q, counted, g.Err, s.dialect.waitArg(max(time.Until(g.NextAttempt), 0)), chunk)
			}
			if err == nil {
				_, err = db.ExecContext(ctx, db.Rebind(stmt), args...)
			}
			if err != nil {
				return fmt.Errorf("sluicesql: outbox: recording the failure of %d rows of %s (row %d first): %w", len(chunk), s.table, chunk[0], err)
			}
		}
	}
	return nil
}

// failedAlike is failures recorded alike: the same error, next attempt and
// fate.
type failedAlike struct {
	outbox.Failed // ID unused
	ids           []int64
}

// alike groups failed by what the store records of them, in the order
// each group first appears.
func alike(failed []outbox.Failed) []*failedAlike {
	var out []*failedAlike
	groups := map[outbox.Failed]*failedAlike{}
	for _, f := range failed {
		k := f // all but the row
		k.ID = 0
		if f.Dead { // recorded without a next attempt
			k.NextAttempt = time.Time{}
		}
		g, ok := groups[k]
		if !ok {
			g = &failedAlike{Failed: f}
			groups[k] = g
			out = append(out, g)
		}
		g.ids = append(g.ids, f.ID)
	}
	return out
}

func (s *Outbox) dueSQLite(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	now := time.Now()
	lease := outboxLeaseDefault
	if d, ok := ctx.Deadline(); ok {
		lease = max(d.Sub(now), outboxHoldMin)
	}
	var sizes []outboxSized
	q := `SELECT id, length(CAST(payload AS BLOB)) + length(CAST(metadata AS BLOB)) AS bytes FROM ` + s.table +
		` WHERE dead_at IS NULL AND next_attempt_at <= ? AND leased_until <= ? ORDER BY id LIMIT ?`
	if err := s.db.SelectContext(ctx, &sizes, q, now.UnixMicro(), now.UnixMicro(), limit); err != nil {
		return nil, fmt.Errorf("sluicesql: outbox: leasing due rows of %s: %w", s.table, err)
	}
	var rs []outboxScanned
	ids := outboxWithin(sizes, maxBytes)
	if len(ids) > 0 {
		// Taken only if still due and free: another relay may have leased
		// them since.
		q, args, err := sqlx.In(`UPDATE `+s.table+` SET leased_until = ? WHERE id IN (?) AND dead_at IS NULL AND next_attempt_at <= ? AND leased_until <= ? RETURNING `+outboxColumns,
			now.Add(lease).UnixMicro(), ids, now.UnixMicro(), now.UnixMicro())
		if err == nil {
			err = s.db.SelectContext(ctx, &rs, q, args...)
		}
		if err != nil {
			return nil, fmt.Errorf("sluicesql: outbox: leasing due rows of %s: %w", s.table, err)
		}
	}
	return &outboxLeaseBatch{s: s, rows: s.decode(rs), cut: len(ids) < len(sizes)}, nil
}

type outboxLeaseBatch struct {
	s    *Outbox
	rows []outbox.Row
	cut  bool // maxBytes left due rows out
}

func (b *outboxLeaseBatch) Rows() []outbox.Row { return b.rows }

func (b *outboxLeaseBatch) CutShort() bool { return b.cut }

func (b *outboxLeaseBatch) Finish(ctx context.Context, relayed []int64, failed []outbox.Failed) error {
	tx, err := b.s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sluicesql: outbox: begin: %w", err)
	}
	if err := b.s.finish(ctx, tx, relayed, failed); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (b *outboxLeaseBatch) Release(ctx context.Context) error {
	if len(b.rows) == 0 {
		return nil
	}
	ids := make([]int64, len(b.rows))
	for i, r := range b.rows {
		ids[i] = r.ID
	}
	q, args, err := sqlx.In(`UPDATE `+b.s.table+` SET leased_until = 0 WHERE id IN (?)`, ids)
	if err != nil {
		return err
	}
	_, err = b.s.db.ExecContext(ctx, q, args...)
	return err
}

// Stats counts what waits in the outbox (outbox.Store).
func (s *Outbox) Stats(ctx context.Context) (outbox.Stats, error) {
	var r struct {
		Pending int64    `db:"pending"`
		Failing int64    `db:"failing"`
		Dead    int64    `db:"dead"`
		Oldest  any      `db:"oldest"`
		Age     *float64 `db:"age"`
	}
	q := `SELECT coalesce(sum(CASE WHEN dead_at IS NULL THEN 1 ELSE 0 END), 0) AS pending,
	coalesce(sum(CASE WHEN dead_at IS NULL AND last_error IS NOT NULL THEN 1 ELSE 0 END), 0) AS failing,
	coalesce(sum(CASE WHEN dead_at IS NULL THEN 0 ELSE 1 END), 0) AS dead,
	min(CASE WHEN dead_at IS NULL THEN created_at END) AS oldest` + s.dialect.oldestAge + ` FROM ` + s.table
	if err := s.db.GetContext(ctx, &r, q); err != nil {
		return outbox.Stats{}, fmt.Errorf("sluicesql: outbox: counting %s: %w", s.table, err)
	}
	st := outbox.Stats{Pending: r.Pending, Failing: r.Failing, Dead: r.Dead}
	if r.Oldest != nil {
		t, err := s.dialect.readTime(r.Oldest)
		if err != nil {
			return outbox.Stats{}, err
		}
		st.Oldest = t
		st.OldestAge = outboxAge(r.Age, t)
	}
	return st, nil
}
