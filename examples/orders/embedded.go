package main

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication/sqlstore/sqlite"
	"github.com/sluicemq/sluice/embedded"
)

const topic = "order.created"

// embeddedEnv: Sluice's in-process broker (embedded.PubSub), SQLite (the
// inbox, the outbox and the business tables), in-process tiers. No servers.
type embeddedEnv struct {
	sqlite   *sqlx.DB
	dir      string
	embedded *embedded.Broker

	mu       sync.Mutex
	rejected int
	stop     context.CancelFunc
	done     chan struct{}
}

func newEmbeddedEnv(ctx context.Context, dbPath string) (_ *embeddedEnv, err error) {
	e := &embeddedEnv{}
	defer func() { // a failed start closes what it opened
		if err != nil {
			_ = e.close()
		}
	}()
	if dbPath == "" {
		dir, err := os.MkdirTemp("", "sluice-orders")
		if err != nil {
			return nil, err
		}
		e.dir, dbPath = dir, filepath.Join(dir, "orders.db")
	}
	db, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		return nil, err
	}
	e.sqlite = db
	for _, stmt := range tables("").schema() {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, err
		}
	}
	e.embedded, err = embedded.New(embedded.Config{Topic: topic, TierDelays: tierDelays})
	return e, err
}

func (e *embeddedEnv) db() *sqlx.DB           { return e.sqlite }
func (e *embeddedEnv) schema() string         { return "" }
func (e *embeddedEnv) tables() tables         { return "" }
func (e *embeddedEnv) broker() broker.Broker  { return e.embedded }
func (e *embeddedEnv) rejectionTopic() string { return rejectedTopic }

// relayPublisher publishes into the in-process broker: held once Publish
// returns (in memory). Its Close leaves closing the broker to Embedded.Close.
func (e *embeddedEnv) relayPublisher() message.Publisher { return e.embedded.PubSub().Publisher() }

// start counts the rejection events delivered on their topic.
func (e *embeddedEnv) start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	out, err := e.embedded.PubSub().Subscribe(ctx, rejectedTopic)
	if err != nil {
		cancel()
		return err
	}
	e.stop, e.done = cancel, make(chan struct{})
	go func() {
		defer close(e.done)
		for m := range out {
			e.mu.Lock()
			e.rejected++
			e.mu.Unlock()
			m.Ack()
		}
	}()
	return nil
}

func (e *embeddedEnv) publish(msgs ...*message.Message) error {
	return e.embedded.PubSub().Publish(topic, msgs...)
}

func (e *embeddedEnv) poisoned(context.Context) ([]*message.Message, error) {
	return e.embedded.Poisoned(), nil
}

func (e *embeddedEnv) rejectionEvents(context.Context) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rejected, nil
}

func (e *embeddedEnv) pendingRetries(context.Context) (int, error) {
	return e.embedded.PendingRetries(), nil
}

func (e *embeddedEnv) close() error {
	if e.stop != nil {
		e.stop()
		<-e.done
	}
	var err error
	if e.embedded != nil {
		err = e.embedded.Close()
	}
	if e.sqlite != nil {
		_ = e.sqlite.Close()
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	return err
}
