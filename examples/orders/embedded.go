package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

const topic = "order.created"

// embeddedEnv: Sluice's in-process broker (embedded.PubSub), SQLite (the
// inbox, the outbox and the business tables), in-process tiers. No servers.
//
// An embedded topic is one queue whose subscribers compete for its
// messages: it routes no message to two handlers (there is no exchange to
// bind a second queue to). So each handler has an embedded broker of its
// own, and the producer publishes each message to each — what the servers
// mode's exchange does for its two queues, though not in one step: a
// publish that failed half-way (a full or closed topic) reached one handler.
type embeddedEnv struct {
	sqlite  *sqlx.DB
	dir     string
	brokers map[string]*embedded.Broker // by handler

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
	e.brokers = map[string]*embedded.Broker{}
	for _, h := range handlers {
		if e.brokers[h], err = embedded.New(embedded.Config{Topic: embeddedTopic(h), TierDelays: tierDelays}); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// embeddedTopic is a handler's topic on its broker: order.created for the
// inventory, order.created.<handler> for another. A router refuses two
// handlers on one topic name — on one broker they would split its
// messages —, so the order log's is named after it, as its queue is on
// RabbitMQ.
func embeddedTopic(handler string) string {
	if handler == inventoryHandler {
		return topic
	}
	return topic + "." + handler
}

func (e *embeddedEnv) db() *sqlx.DB           { return e.sqlite }
func (e *embeddedEnv) schema() string         { return "" }
func (e *embeddedEnv) tables() tables         { return "" }
func (e *embeddedEnv) rejectionTopic() string { return rejectedTopic }

func (e *embeddedEnv) broker(handler string) broker.Broker { return e.brokers[handler] }

// relayPublisher publishes into the inventory's in-process broker: held
// once Publish returns (in memory). Its Close leaves closing the broker to
// Embedded.Close.
func (e *embeddedEnv) relayPublisher() message.Publisher {
	return e.brokers[inventoryHandler].PubSub().Publisher()
}

// start counts the rejection events delivered on their topic.
func (e *embeddedEnv) start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	out, err := e.brokers[inventoryHandler].PubSub().Subscribe(ctx, rejectedTopic)
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

// publish stores each message in every handler's broker (each keeps a
// copy of its own).
func (e *embeddedEnv) publish(msgs ...*message.Message) error {
	for _, h := range handlers {
		if err := e.brokers[h].PubSub().Publish(embeddedTopic(h), msgs...); err != nil {
			return fmt.Errorf("publishing to the %s handler's broker: %w", h, err)
		}
	}
	return nil
}

func (e *embeddedEnv) poisoned(_ context.Context, handler string) ([]*message.Message, error) {
	return e.brokers[handler].Poisoned(), nil
}

func (e *embeddedEnv) rejectionEvents(context.Context) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rejected, nil
}

func (e *embeddedEnv) pendingRetries(context.Context) (int, error) {
	n := 0
	for _, b := range e.brokers {
		n += b.PendingRetries()
	}
	return n, nil
}

func (e *embeddedEnv) close() error {
	if e.stop != nil {
		e.stop()
		<-e.done
	}
	var errs []error
	for _, h := range handlers {
		if b := e.brokers[h]; b != nil {
			if err := b.Close(); err != nil {
				errs = append(errs, fmt.Errorf("the %s handler's broker: %w", h, err))
			}
		}
	}
	if e.sqlite != nil {
		_ = e.sqlite.Close()
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	return errors.Join(errs...)
}
