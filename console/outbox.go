package console

import (
	"context"

	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/sluicesql"
)

// SQLOutbox is an sluicesql.Outbox table as the console reads it.
func SQLOutbox(s *sluicesql.Outbox) Outbox { return sqlOutbox{s} }

type sqlOutbox struct{ s *sluicesql.Outbox }

func (o sqlOutbox) Stats(ctx context.Context) (outbox.Stats, error) { return o.s.Stats(ctx) }

func (o sqlOutbox) RetryNow(ctx context.Context) (int64, error) { return o.s.RetryNow(ctx) }

func (o sqlOutbox) List(ctx context.Context, failing bool, limit int) ([]OutboxEntry, error) {
	which := sluicesql.OutboxAll
	if failing {
		which = sluicesql.OutboxFailing
	}
	es, err := o.s.List(ctx, which, limit)
	out := make([]OutboxEntry, len(es))
	for i, e := range es {
		out[i] = OutboxEntry{ID: e.ID, Topic: e.Topic, EventID: e.EventID, Attempts: e.Attempts, LastError: e.LastError, CreatedAt: e.CreatedAt}
	}
	return out, err
}
