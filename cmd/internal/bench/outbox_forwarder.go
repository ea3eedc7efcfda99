package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/rabbitmq"
)

// forwarderRun writes ms with watermill-sql's publisher wrapped in the
// forwarder's (as examples/orders did), into a table of its own for this
// round, then runs Watermill's forwarder from watermill-sql's subscriber to
// pub until every message is confirmed, and returns their rate from the
// forwarder's start.
func forwarderRun(ctx context.Context, db *sqlx.DB, schema string, pub *rabbitmq.Publisher, queue, topic string, ms []*message.Message) (float64, error) {
	schemaAdapter := wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(t string) string { return fmt.Sprintf(`%s."watermill_%s"`, schema, t) },
		SubscribeBatchSize:        100,
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter: schemaAdapter,
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: func(t string) string {
			return fmt.Sprintf(`%s."watermill_offsets_%s"`, schema, t)
		}},
		InitializeSchema: true,
		ConsumerGroup:    "relay",
		PollInterval:     50 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	ownSub := true // until the forwarder's router owns it and closes it (closing it twice races in watermill-sql)
	defer func() {
		if ownSub {
			_ = sub.Close()
		}
	}()
	if err := sub.SubscribeInitialize(topic); err != nil {
		return 0, err
	}
	for chunk := range slices.Chunk(ms, 500) {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return 0, err
		}
		p, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: schemaAdapter}, watermill.NopLogger{})
		if err != nil {
			_ = tx.Rollback()
			return 0, err
		}
		if err := forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: topic}).Publish(queue, chunk...); err != nil {
			_ = tx.Rollback()
			return 0, err
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
	}
	out := &countingPublisher{pub: pub, n: int64(len(ms)), all: make(chan struct{})}
	fwd, err := forwarder.NewForwarder(sub, out, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: topic})
	if err != nil {
		return 0, err
	}
	ownSub = false
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-out.all:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(5 * time.Minute):
		err = fmt.Errorf("%d of %d messages forwarded in 5 minutes", out.done.Load(), len(ms))
	}
	if err = errors.Join(err, fwd.Close(), <-runErr); err != nil {
		return 0, err
	}
	return float64(len(ms)) / out.end.Sub(start).Seconds(), nil
}

// countingPublisher publishes on pub and notes when n messages were
// confirmed.
type countingPublisher struct {
	pub  message.Publisher
	n    int64
	done atomic.Int64
	end  time.Time
	all  chan struct{}
}

func (c *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := c.pub.Publish(topic, msgs...); err != nil {
		return err
	}
	if d := c.done.Add(int64(len(msgs))); d >= c.n && d-int64(len(msgs)) < c.n {
		c.end = time.Now()
		close(c.all)
	}
	return nil
}

func (c *countingPublisher) Close() error { return nil }
