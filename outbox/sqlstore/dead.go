package sqlstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
)

// Settled is a dead row an operator requeued or discarded: what the audit
// records of it.
type Settled struct {
	ID        int64
	Topic     string
	MessageID string
	EventID   string
}

// Requeue makes dead rows pending again, due now, with their attempts
// counted from zero (the cause fixed: the queue declared, the producer's
// bug fixed): the ids given, or every dead row when ids is empty. It
// touches only dead rows and returns those it requeued.
func (s *Store) Requeue(ctx context.Context, ids []int64) ([]Settled, error) {
	out, err := s.settle(ctx, `UPDATE `+s.table+` SET dead_at = NULL, attempts = 0, next_attempt_at = `+s.dialect.now, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox/sqlstore: requeueing dead rows of %s: %w", s.table, err)
	}
	if len(out) > 0 {
		s.Wake()
	}
	return out, nil
}

// Discard deletes dead rows for good — their events are never published:
// the ids given, or every dead row when ids is empty. It touches only dead
// rows (a pending row is never deleted) and returns those it deleted.
func (s *Store) Discard(ctx context.Context, ids []int64) ([]Settled, error) {
	out, err := s.settle(ctx, `DELETE FROM `+s.table, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox/sqlstore: discarding dead rows of %s: %w", s.table, err)
	}
	return out, nil
}

// settle runs stmt (an UPDATE's SET or a DELETE) on the dead rows of ids,
// or on every dead row, and returns them.
func (s *Store) settle(ctx context.Context, stmt string, ids []int64) ([]Settled, error) {
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
	out := make([]Settled, len(rs))
	for i, r := range rs {
		md, _ := decodeMetadata(r.Metadata)
		out[i] = Settled{ID: r.ID, Topic: r.Topic, MessageID: r.MessageID, EventID: md[sluice.EventIDKey]}
	}
	return out, nil
}
