package dlq

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/sqldb"
	"github.com/sluicemq/sluice/internal/sqlname"
)

// RestoreConfig configures Restore.
type RestoreConfig struct {
	Source   RestoreSource // an archive file (OpenFileSource) or table (OpenTableSource)
	To       string        // publish every record here instead of the queue it was archived from
	EventIDs []string      // only these events (none: every record)
	Limit    int           // restore at most this many (0: all)
	DryRun   bool
	// AcceptUndigested restores records without a digest (archives written
	// before records had one); a record with a digest is always checked.
	AcceptUndigested bool

	op Config // Restore's, set by it
}

// A RestoreSource yields the records of an archive one at a time.
type RestoreSource interface {
	// Next returns the next record and where it is ("FILE line 3",
	// "table T row 7"); io.EOF when there are no more.
	Next(ctx context.Context) (ArchiveRecord, string, error)
	// Restored is called once the record Next returned last was published
	// (confirmed): a table marks its row restored so that a rerun skips it.
	Restored(ctx context.Context) error
	// Check reads every record Next would return, without taking or
	// marking any, and calls check with each; it stops at the first error,
	// a record that cannot be read among them.
	Check(ctx context.Context, check func(rec ArchiveRecord, where string) error) error
	// Name names the source in summaries and the audit log.
	Name() string
	Close() error
}

// check returns where rec goes and its payload, or why it is refused: a
// digest or signature that does not verify, a queue outside its family, a
// payload that does not decode.
func (cfg RestoreConfig) check(rec ArchiveRecord, where string) (string, []byte, error) {
	if err := rec.verify(cfg.op.Signer, cfg.AcceptUndigested); err != nil {
		return "", nil, fmt.Errorf("dlq: %s: %w", where, err)
	}
	payload := []byte(rec.Payload)
	if rec.PayloadBase64 != "" {
		var err error
		if payload, err = base64.StdEncoding.DecodeString(rec.PayloadBase64); err != nil {
			return "", nil, fmt.Errorf("dlq: %s: payload_base64: %w", where, err)
		}
	}
	if cfg.To != "" {
		return cfg.To, payload, nil
	}
	target, err := rec.family()
	if err != nil {
		return "", nil, fmt.Errorf("dlq: %s: %w", where, err)
	}
	return target, payload, nil
}

// name is how plans name rec: its event id, else its UUID.
func (rec ArchiveRecord) name() string {
	if rec.EventID != "" {
		return "event " + diag.Printable(rec.EventID, 128)
	}
	return "message " + diag.Printable(rec.UUID, 64)
}

// Restore publishes every record of an archive back — to the poison queue
// it was archived from, or To — with its payload, metadata (headers) and
// the producer's properties as they were, each confirmed before the source
// records it restored.
//
// It first checks every record (Source.Check): one that cannot be read (a
// truncated or malformed line), whose digest or signature does not verify,
// or whose queue is not its family's poison queue (without To) stops the
// run naming where it is, and nothing is published. A record that changed
// since, or whose publish fails, stops the run there; those before it were
// restored. A crash between the publish and the source's record publishes
// that record again on the next run (at least once: the consumer's inbox
// sees a duplicate).
func Restore(ctx context.Context, op Config, cfg RestoreConfig) (Result, error) {
	cfg.op = op
	res := Result{ByTarget: map[string]int{}}
	want := map[string]bool{}
	for _, id := range cfg.EventIDs {
		want[id] = true
	}
	if err := cfg.Source.Check(ctx, func(rec ArchiveRecord, where string) error {
		_, _, err := cfg.check(rec, where)
		return err
	}); err != nil {
		return res, fmt.Errorf("%w (nothing was restored)", err)
	}
	for cfg.Limit <= 0 || res.Selected < cfg.Limit {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		rec, where, err := cfg.Source.Next(ctx)
		if errors.Is(err, io.EOF) {
			return res, nil
		} else if err != nil {
			return res, err
		}
		res.Scanned++
		if len(want) > 0 && !want[rec.EventID] {
			continue
		}
		target, payload, err := cfg.check(rec, where)
		if err != nil {
			return res, err
		}
		res.Selected++
		if cfg.DryRun {
			res.ByTarget[target]++
			res.Plan = append(res.Plan, Planned{Message: rec.name(), Target: target})
			continue
		}
		m := message.NewMessage(cmp.Or(rec.UUID, watermill.NewUUID()), payload)
		for k, v := range rec.Metadata {
			if !strings.HasPrefix(k, metakeys.DeliveryPrefix) { // the archived delivery's, not the message's
				m.Metadata[k] = v
			}
		}
		if err := cfg.op.Publisher.Publish(target, m); err != nil {
			return res, fmt.Errorf("dlq: restoring %s to %s: %w", where, diag.Printable(target, 255), err)
		}
		actx, cancel := afterConfirm(ctx)
		err = cfg.Source.Restored(actx)
		cancel()
		if err != nil {
			return res, fmt.Errorf("dlq: %s was restored to %s but not recorded as restored (a rerun publishes it again): %w", where, diag.Printable(target, 255), err)
		}
		res.Replayed++
		res.ByTarget[target]++
	}
	return res, nil
}

var (
	_ RestoreSource = (*fileSource)(nil)
	_ RestoreSource = (*tableSource)(nil)
)

// fileSource reads an archive file written by Archive: one JSON record a
// line, each ending in a newline.
type fileSource struct {
	f    *os.File
	r    *bufio.Reader
	line int
}

// OpenFileSource opens an archive file written by OpenFileSink: one JSON
// record a line. Restored does nothing (restoring it again publishes
// again).
func OpenFileSource(path string) (RestoreSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dlq: opening the archive: %w", err)
	}
	return &fileSource{f: f, r: bufio.NewReader(f)}, nil
}

// Next decodes the next line. A last line without its newline is a record
// cut short (a write torn by a crash, a truncated copy): an error, even
// when what is there decodes.
func (s *fileSource) Next(context.Context) (ArchiveRecord, string, error) {
	return readRecord(s.r, s.f.Name(), &s.line)
}

// readRecord reads the next line of r, the *line-th of the file name.
func readRecord(r *bufio.Reader, name string, line *int) (ArchiveRecord, string, error) {
	var rec ArchiveRecord
	b, err := r.ReadBytes('\n')
	if errors.Is(err, io.EOF) && len(b) == 0 {
		return rec, "", io.EOF
	}
	*line++
	where := fmt.Sprintf("%s line %d", diag.Printable(name, 255), *line)
	switch {
	case errors.Is(err, io.EOF):
		return rec, where, fmt.Errorf("dlq: %s: truncated: the record has no end of line (%d bytes)", where, len(b))
	case err != nil:
		return rec, where, fmt.Errorf("dlq: %s: %w", where, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&rec); err != nil {
		return rec, where, fmt.Errorf("dlq: %s: not an archive record: %w", where, err)
	}
	if dec.More() {
		return rec, where, fmt.Errorf("dlq: %s: not an archive record: more than one JSON value on the line", where)
	}
	return rec, where, nil
}

// Restored does nothing: a file is not written to (restoring it again
// publishes again).
func (s *fileSource) Restored(context.Context) error { return nil }

// Check reads the whole file, from its start, on a reader of its own.
func (s *fileSource) Check(ctx context.Context, check func(ArchiveRecord, string) error) error {
	f, err := os.Open(s.f.Name())
	if err != nil {
		return fmt.Errorf("dlq: opening the archive: %w", err)
	}
	defer func() { _ = f.Close() }()
	r, line := bufio.NewReader(f), 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, where, err := readRecord(r, s.f.Name(), &line)
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if err := check(rec, where); err != nil {
			return err
		}
	}
}

// Name is the file's path.
func (s *fileSource) Name() string { return s.f.Name() }

// Close closes the file.
func (s *fileSource) Close() error { return s.f.Close() }

// tableSource reads the rows of an archive table (tableSink) not yet
// restored, in the order they were archived. Each row is read in a
// transaction of its own that locks it (FOR UPDATE SKIP LOCKED: two
// restores at once take different rows) until Restored marks it restored
// (restored_at, restored_by) and commits.
type tableSource struct {
	db       *sqlx.DB
	table    string
	operator string
	eventIDs []string
	tx       *sqlx.Tx
	endTx    context.CancelFunc // ends tx's context once tx is over
	row      int64              // the row Next returned last
}

// OpenTableSource reads the rows of table on db (PostgreSQL; written by
// NewTableSink) not yet restored, in the order they were archived; eventIDs,
// when given, select the rows of those events only. Each row is read in a
// transaction of its own that locks it (FOR UPDATE SKIP LOCKED: two
// restores at once take different rows) until Restored marks it restored
// (restored_at, and operator as restored_by) and commits. The pool is the
// caller's, opened with its driver (dlq links none); Close leaves it open.
func OpenTableSource(ctx context.Context, db *sqlx.DB, table, operator string, eventIDs []string) (RestoreSource, error) {
	quoted, _, err := sqlname.Quote(table, true)
	if err != nil {
		return nil, fmt.Errorf("dlq: archive %w", err)
	}
	// A missing table, or one not written by a tableSink, is an error now.
	if err := storeCall(ctx, "checking the archive table", func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, `SELECT id, queue, record, restored_at, restored_by FROM `+quoted+` LIMIT 0`)
		return err
	}); err != nil {
		return nil, fmt.Errorf("dlq: reading the archive table: %w", err)
	}
	return &tableSource{db: db, table: quoted, operator: operator, eventIDs: eventIDs}, nil
}

// tableRow is a row of an archive table as restore reads it.
type tableRow struct {
	ID     int64  `db:"id"`
	Queue  string `db:"queue"`
	Record string `db:"record"`
}

// query selects the rows not yet restored after row id, of the events
// selected.
func (s *tableSource) query(after int64) (string, []any) {
	q := `SELECT id, queue, record FROM ` + s.table + ` WHERE restored_at IS NULL AND id > $1`
	args := []any{after}
	if len(s.eventIDs) > 0 {
		q += ` AND event_id = ANY(CAST($2 AS TEXT)::TEXT[])`
		args = append(args, sqldb.TextArray(s.eventIDs)) // no driver's array type: dlq links none
	}
	return q + ` ORDER BY id`, args
}

// decode returns the record of row; its queue column must be the record's.
func (s *tableSource) decode(row tableRow) (ArchiveRecord, string, error) {
	var rec ArchiveRecord
	where := fmt.Sprintf("table %s row %d", s.table, row.ID)
	if err := json.Unmarshal([]byte(row.Record), &rec); err != nil {
		return rec, where, fmt.Errorf("dlq: %s: not an archive record: %w", where, err)
	}
	if row.Queue != rec.Queue {
		return rec, where, fmt.Errorf("dlq: %s: %w: its queue column %q is not its record's %q", where, ErrDigest,
			diag.Bound(row.Queue, 255), diag.Bound(rec.Queue, 255))
	}
	return rec, where, nil
}

// Next locks and reads the next row not yet restored, letting go of the
// row it returned before if that one was not restored.
func (s *tableSource) Next(ctx context.Context) (ArchiveRecord, string, error) {
	var rec ArchiveRecord
	if err := s.release(); err != nil {
		return rec, "", err
	}
	tx, end, err := begin(ctx, s.db)
	if err != nil {
		return rec, "", fmt.Errorf("dlq: reading the archive table: %w", err)
	}
	q, args := s.query(s.row)
	var row tableRow
	err = storeCall(ctx, "locking the next row", func(ctx context.Context) error {
		return tx.GetContext(ctx, &row, q+` LIMIT 1 FOR UPDATE SKIP LOCKED`, args...)
	})
	if errors.Is(err, sql.ErrNoRows) {
		_ = tx.Rollback()
		end()
		return rec, "", io.EOF
	} else if err != nil {
		_ = tx.Rollback()
		end()
		return rec, "", fmt.Errorf("dlq: reading the archive table: %w", err)
	}
	s.tx, s.endTx, s.row = tx, end, row.ID
	return s.decode(row)
}

// begin begins a transaction on db whose BEGIN is bounded by callTimeout
// and ctx, but whose context does not end with ctx afterwards: database/sql
// rolls a transaction back when its context ends, and an interrupt after
// the row's publish must still mark it (Restored) — Close lets go of a row
// never published. end ends the transaction's context, once it is over.
func begin(ctx context.Context, db *sqlx.DB) (*sqlx.Tx, context.CancelFunc, error) {
	tctx, end := context.WithCancel(context.WithoutCancel(ctx))
	stop := bounded.Watch(ctx, callTimeout, func(error) { end() })
	tx, err := db.BeginTxx(tctx, nil)
	if why := stop(); why != nil { // tctx ended: the transaction is gone
		if tx != nil {
			_ = tx.Rollback()
		}
		end()
		if err != nil {
			return nil, nil, fmt.Errorf("BEGIN: %w: %w", why, err)
		}
		return nil, nil, fmt.Errorf("BEGIN: %w", why)
	}
	if err != nil {
		end()
		return nil, nil, err
	}
	return tx, end, nil
}

// over ends the context of the transaction Next returned last.
func (s *tableSource) over() {
	if s.endTx != nil {
		s.endTx()
		s.endTx = nil
	}
}

// Check reads every row Next would take, without locking any, in pages.
func (s *tableSource) Check(ctx context.Context, check func(ArchiveRecord, string) error) error {
	const page = 500
	var after int64
	for {
		q, args := s.query(after)
		var rows []tableRow
		if err := storeCall(ctx, "reading a page of rows", func(ctx context.Context) error {
			return s.db.SelectContext(ctx, &rows, q+fmt.Sprintf(` LIMIT %d`, page), args...)
		}); err != nil {
			return fmt.Errorf("dlq: reading the archive table: %w", err)
		}
		for _, row := range rows {
			rec, where, err := s.decode(row)
			if err != nil {
				return err
			}
			if err := check(rec, where); err != nil {
				return err
			}
			after = row.ID
		}
		if len(rows) < page {
			return nil
		}
	}
}

// Restored marks the row Next returned last restored and commits.
func (s *tableSource) Restored(ctx context.Context) error {
	if s.tx == nil {
		return errors.New("dlq: no row to mark restored")
	}
	tx := s.tx
	s.tx = nil
	defer s.over()
	if _, err := tx.ExecContext(ctx, `UPDATE `+s.table+` SET restored_at = now(), restored_by = $1 WHERE id = $2`, s.operator, s.row); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// release lets go of the row Next returned last when it was not restored
// (a dry run, a record not selected): it stays as it was.
func (s *tableSource) release() error {
	if s.tx == nil {
		return nil
	}
	tx := s.tx
	s.tx = nil
	defer s.over()
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("dlq: reading the archive table: %w", err)
	}
	return nil
}

// Name is "table T".
func (s *tableSource) Name() string { return "table " + s.table }

// Close releases the row taken last, if any; the database is the caller's.
func (s *tableSource) Close() error { return s.release() }
