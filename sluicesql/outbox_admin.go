package sluicesql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
)

// OutboxEntry is a row as an operator sees it (List; Requeue and Discard
// fill its ID, Topic, MessageID and EventID).
type OutboxEntry struct {
	ID        int64
	Topic     string
	MessageID string
	EventID   string
	Attempts  int
	// LastError is the last publish's error, redacted (a URL's password,
	// a token) as it is read: the table may hold one written before.
	LastError   string
	CreatedAt   time.Time
	NextAttempt time.Time
	// DeadAt is when the relay set the row aside as dead; zero while it is
	// still tried.
	DeadAt time.Time
}

// OutboxWhich selects the rows List returns.
type OutboxWhich int

// The rows List returns.
const (
	// All rows, dead ones included.
	OutboxAll OutboxWhich = iota
	// Failing rows: whose last publish failed, still tried.
	OutboxFailing
	// Dead rows: set aside by the relay after its MaxAttempts, waiting for
	// an operator's Requeue or Discard.
	OutboxDead
)

// List returns up to limit rows of which, oldest first.
func (s *Outbox) List(ctx context.Context, which OutboxWhich, limit int) ([]OutboxEntry, error) {
	var rs []struct {
		ID        int64          `db:"id"`
		Topic     string         `db:"topic"`
		MessageID string         `db:"message_id"`
		Metadata  []byte         `db:"metadata"`
		Attempts  int            `db:"attempts"`
		LastError sql.NullString `db:"last_error"`
		Created   any            `db:"created_at"`
		Next      any            `db:"next_attempt_at"`
		Dead      any            `db:"dead_at"`
	}
	where := ""
	switch which {
	case OutboxFailing:
		where = ` WHERE last_error IS NOT NULL AND dead_at IS NULL`
	case OutboxDead:
		where = ` WHERE dead_at IS NOT NULL`
	}
	q := s.db.Rebind(`SELECT id, topic, message_id, metadata, attempts, last_error, created_at, next_attempt_at, dead_at FROM ` + s.table + where + ` ORDER BY id LIMIT ?`)
	if err := s.db.SelectContext(ctx, &rs, q, limit); err != nil {
		return nil, fmt.Errorf("sluicesql: outbox: listing %s: %w", s.table, err)
	}
	out := make([]OutboxEntry, 0, len(rs))
	for _, r := range rs {
		md, _ := outboxDecode(r.Metadata) // an unreadable one is shown without its event id
		created, err := s.dialect.readTime(r.Created)
		if err != nil {
			return nil, err
		}
		next, err := s.dialect.readTime(r.Next)
		if err != nil {
			return nil, err
		}
		e := OutboxEntry{ID: r.ID, Topic: r.Topic, MessageID: r.MessageID, EventID: md[sluice.EventIDKey],
			Attempts: r.Attempts, LastError: diag.Redact(r.LastError.String), CreatedAt: created, NextAttempt: next}
		if r.Dead != nil {
			if e.DeadAt, err = s.dialect.readTime(r.Dead); err != nil {
				return nil, err
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// RetryNow makes every failing row due at once (after the cause is fixed:
// a queue declared, a binding added) and returns how many it touched.
func (s *Outbox) RetryNow(ctx context.Context) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.db.Rebind(`UPDATE `+s.table+` SET next_attempt_at = `+s.dialect.after+` WHERE last_error IS NOT NULL AND dead_at IS NULL`), s.dialect.waitArg(0))
	if err != nil {
		return 0, fmt.Errorf("sluicesql: outbox: %w", err)
	}
	s.Wake()
	return res.RowsAffected()
}

// Requeue makes dead rows pending again, due now, with their attempts
// counted from zero (the cause fixed: the queue declared, the producer's
// bug fixed): the ids given, or every dead row when ids is empty. It
// touches only dead rows and returns those it requeued (their ID, Topic,
// MessageID and EventID: what the audit records).
func (s *Outbox) Requeue(ctx context.Context, ids []int64) ([]OutboxEntry, error) {
	out, err := s.settle(ctx, `UPDATE `+s.table+` SET dead_at = NULL, attempts = 0, next_attempt_at = `+s.dialect.now, ids)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: outbox: requeueing dead rows of %s: %w", s.table, err)
	}
	if len(out) > 0 {
		s.Wake()
	}
	return out, nil
}

// Discard deletes dead rows for good — their events are never published:
// the ids given, or every dead row when ids is empty. It touches only dead
// rows (a pending row is never deleted) and returns those it deleted
// (their ID, Topic, MessageID and EventID: what the audit records).
func (s *Outbox) Discard(ctx context.Context, ids []int64) ([]OutboxEntry, error) {
	out, err := s.settle(ctx, `DELETE FROM `+s.table, ids)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: outbox: discarding dead rows of %s: %w", s.table, err)
	}
	return out, nil
}

// settle runs stmt (an UPDATE's SET or a DELETE) on the dead rows of ids,
// or on every dead row, and returns them.
func (s *Outbox) settle(ctx context.Context, stmt string, ids []int64) ([]OutboxEntry, error) {
	q, args := stmt+` WHERE dead_at IS NOT NULL`, []any(nil)
	if len(ids) > 0 {
		var err error
		q, args, err = sqlx.In(q+` AND id IN (?)`, ids)
		if err != nil {
			return nil, err
		}
	}
	var rs []struct {
		ID        int64  `db:"id"`
		Topic     string `db:"topic"`
		MessageID string `db:"message_id"`
		Metadata  []byte `db:"metadata"`
	}
	if err := s.db.SelectContext(ctx, &rs, s.db.Rebind(q+` RETURNING id, topic, message_id, metadata`), args...); err != nil {
		return nil, err
	}
	out := make([]OutboxEntry, len(rs))
	for i, r := range rs {
		md, _ := outboxDecode(r.Metadata)
		out[i] = OutboxEntry{ID: r.ID, Topic: r.Topic, MessageID: r.MessageID, EventID: md[sluice.EventIDKey]}
	}
	return out, nil
}
