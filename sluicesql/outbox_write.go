package sluicesql

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metadatacodec"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/unitofwork"
)

// Publish writes msgs, to be published to topic, in the inbox's SQL
// transaction that ctx carries (TxFromContext), as
// outbox.Writer says: they commit with the claim and the business writes.
// The outbox table must be in the inbox's database. It wakes the store's
// relay once the transaction commits.
func (s *Outbox) Publish(ctx context.Context, topic string, msgs ...*message.Message) error {
	tx := TxFromContext(ctx)
	if tx == nil {
		return fmt.Errorf("%w: ctx carries no SQL inbox transaction (Publish runs inside the inbox stage with a sluicesql.Inbox; elsewhere, Write in a transaction of your own)", unitofwork.ErrMissing)
	}
	if !s.speaks(tx.DriverName()) {
		return fmt.Errorf("%w: the inbox's transaction is on %s, the outbox on %s", unitofwork.ErrMissing, tx.DriverName(), s.db.DriverName())
	}
	rows, err := s.rows(ctx, topic, msgs)
	if err != nil {
		return err
	}
	err = s.insert(ctx, tx, rows)
	switch {
	case err == nil, aborted(err):
		// Written, or refused because the handler's own statement aborted
		// the transaction: either way, a rejection's claim recorded alone
		// carries these rows too.
		unitofwork.OnRecordAlone(ctx, func(ctx context.Context, u unitofwork.Tx) error {
			t := TxOf(u)
			if t == nil {
				return fmt.Errorf("sluicesql: outbox: the unit of work is not an SQL transaction")
			}
			return s.insert(ctx, t, rows)
		})
		unitofwork.OnCommit(ctx, s.Wake)
	}
	if err != nil && aborted(err) {
		return fmt.Errorf("%w: sluicesql: writing %d messages to %s: %w", unitofwork.ErrAborted, len(msgs), s.table, err)
	}
	if err != nil {
		return fmt.Errorf("sluicesql: outbox: writing %d messages to %s: %w", len(msgs), s.table, err)
	}
	return nil
}

// speaks reports whether a database of driver driverName is of the
// store's dialect.
func (s *Outbox) speaks(driverName string) bool {
	return outboxDialects[driverName].name == s.dialect.name
}

// CheckInbox reports whether Publish can write in store's units of work:
// an SQL inbox (Inbox) of the same dialect
// (outbox.Writer). Both tables must also be in one database, which
// it cannot see: give both stores the same DB.
func (s *Outbox) CheckInbox(store deduplication.Store) error {
	in, ok := store.(*Inbox)
	if !ok {
		return fmt.Errorf("%w: the inbox's store is a %T, whose units of work are no SQL transactions: the outbox on SQL needs sluicesql.Inbox", unitofwork.ErrMissing, store)
	}
	if !s.speaks(in.db.DriverName()) {
		return fmt.Errorf("%w: the inbox is on %s, the outbox on %s", unitofwork.ErrMissing, in.db.DriverName(), s.db.DriverName())
	}
	return nil
}

// Write writes msgs, to be published to topic, in tx — a transaction of
// your own on the outbox's database (*sql.Tx, *sqlx.Tx), for a service that produces outside a
// consumer (an HTTP handler writing an order and its event): they commit
// with it. The topic is 1 to 255 bytes. Call Wake after the commit, or the
// relay finds them within its PollInterval. Each message gets its ids as
// Publish gives them.
func (s *Outbox) Write(ctx context.Context, tx sqlx.ExecerContext, topic string, msgs ...*message.Message) error {
	rows, err := s.rows(ctx, topic, msgs)
	if err != nil {
		return err
	}
	if err := s.insert(ctx, tx, rows); err != nil {
		return fmt.Errorf("sluicesql: outbox: writing %d messages to %s: %w", len(msgs), s.table, err)
	}
	return nil
}

// row is a message encoded for its INSERT.
type outboxRow struct {
	topic, id         string
	metadata, payload []byte
}

func outboxEncode(md message.Metadata) []byte { return metadatacodec.Encode(md) }

func outboxDecode(b []byte) (message.Metadata, error) {
	md, err := metadatacodec.Decode(b)
	return message.Metadata(md), err
}

// rows gives each message its ids and ctx's trace context, and encodes it.
func (s *Outbox) rows(ctx context.Context, topic string, msgs []*message.Message) ([]outboxRow, error) {
	traced := trace.SpanContextFromContext(ctx).IsValid()
	if topic == "" || len(topic) > outboxTopicMaxLength {
		return nil, fmt.Errorf("sluicesql: outbox: topic must be 1 to %d bytes, got %d", outboxTopicMaxLength, len(topic))
	}
	out := make([]outboxRow, len(msgs))
	for i, m := range msgs {
		if m == nil {
			return nil, fmt.Errorf("sluicesql: outbox: message %d is nil", i)
		}
		if m.UUID == "" {
			m.UUID = watermill.NewUUID()
		}
		if m.Metadata == nil {
			m.Metadata = message.Metadata{}
		}
		outboxOwnHistory(ctx, m)
		if m.Metadata.Get(sluice.EventIDKey) == "" {
			m.Metadata.Set(sluice.EventIDKey, m.UUID)
		}
		if traced && !slices.ContainsFunc(s.prop.Fields(), func(f string) bool { return m.Metadata.Get(f) != "" }) {
			s.prop.Inject(ctx, propagation.MapCarrier(m.Metadata)) // the producer's own trace context wins
		}
		if err := s.checkPublish(topic, i, m); err != nil {
			return nil, err
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		out[i] = outboxRow{topic: topic, id: m.UUID, metadata: outboxEncode(m.Metadata), payload: payload}
	}
	return out, nil
}

// insertChunk bounds the rows of one INSERT statement.
const outboxInsertChunk = 100

func (s *Outbox) insert(ctx context.Context, tx sqlx.ExecerContext, rows []outboxRow) error {
	for len(rows) > 0 {
		n := min(len(rows), outboxInsertChunk)
		var q strings.Builder
		q.WriteString(`INSERT INTO ` + s.table + ` (topic, message_id, metadata, payload, created_at, next_attempt_at) VALUES `)
		args := make([]any, 0, 4*n)
		for i, r := range rows[:n] {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString(s.dialect.values(len(args)))
			args = append(args, r.topic, r.id, r.metadata, r.payload)
		}
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// ownHistory makes m a message of its own, not a continuation of the
// delivery being handled, whose metadata a handler often copies into what
// it produces (correlation, tracing; msg.Copy() to forward it):
//   - it carries none of Sluice's control headers (sluice.IsControlKey: the
//     attempt, the failures, the origin, the poison diagnosis, the replay
//     marks, the signature) nor the dead-letter facts of a delivery: a
//     forwarded copy does not bring its retry history to the queue it goes
//     to, where a signing key shared between services would make it
//     believed;
//   - an event id equal to the delivery's (sluice.EventIDKey, copied with
//     the rest) is replaced by a new one, so the receiving inbox does not
//     take a fan-out's messages for duplicates of one another. An event id
//     the handler set on purpose — any other — is kept.
func outboxOwnHistory(ctx context.Context, m *message.Message) {
	for k := range m.Metadata {
		if sluice.IsControlKey(k) || k == metakeys.DeadLetterQueue || k == metakeys.DeadLetterReason {
			delete(m.Metadata, k)
		}
	}
	if id := unitofwork.EventID(ctx); id != "" && m.Metadata.Get(sluice.EventIDKey) == id {
		m.Metadata.Set(sluice.EventIDKey, watermill.NewUUID())
	}
}

// checkPublish returns, classified sluice.Poison, the Checker's refusal of
// message i, to topic: what can never be published is not written.
func (s *Outbox) checkPublish(topic string, i int, m *message.Message) error {
	if s.check == nil {
		return nil
	}
	if err := s.check.CheckPublish(topic, m); err != nil {
		return sluice.Poison(fmt.Errorf("sluicesql: outbox: message %d (%s) to %q cannot be published, not written: %w", i, diag.Printable(m.UUID, 64), topic, err))
	}
	return nil
}
