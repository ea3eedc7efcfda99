package sluicetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/service"
)

// subjectKey is the metadata key the kit writes on each message a test
// publishes: the subject its Trace is kept under. Sluice carries it, like
// any header, into the copies of the tiers and of the poison queue.
const subjectKey = "sluicetest_subject"

// Defaults of Config.
const (
	// topicDefault is Config.Topic's default.
	topicDefault = "sluicetest.input"
	// nameDefault is the handler's name when Config.Handler.Name is empty.
	nameDefault = "handler"
	// shutdownGraceDefault is the ShutdownGrace stage's grace on the kit
	// when the handler's Stages leave it unset: Shutdown waits for it in
	// real time.
	shutdownGraceDefault = 100 * time.Millisecond
	// idleTimeoutDefault is Config.IdleTimeout's default.
	idleTimeoutDefault = 30 * time.Second
	// settleLimitDefault is Config.SettleLimit's default.
	settleLimitDefault = 24 * time.Hour
)

// Config configures a Harness.
type Config struct {
	// Handler is the handler under test, as the service takes it:
	// Handler, PublishingHandler (with PublishTopic) or BatchHandler (its
	// batches gathered in real time, MaxWait; its outcomes' tiers and the
	// brake on the virtual clock), Key, Stages, Without, GroupCommit. Its Broker must be nil: the kit's, or
	// Config.Broker. Name defaults to "handler".
	Handler service.Handler
	// DB is the database of the inbox, outbox and replay tables and of the
	// handler's own: your PostgreSQL (lib/pq or pgx) or SQLite. Default a
	// new SQLite database in a temporary directory of the test.
	DB *sqlx.DB
	// Schema is the PostgreSQL schema of Sluice's tables (created when
	// missing). Default the connection's current schema (current_schema():
	// the first of its search_path that exists).
	Schema string
	// Setup creates the handler's own tables (and rows) before the
	// handler runs; Sluice's tables are created by the service's stores'
	// Migrate.
	Setup func(ctx context.Context, db *sqlx.DB) error
	// Topic the handler consumes on the kit's broker. Default "sluicetest.input".
	Topic string
	// TierDelays of the kit's retry tiers. Default 30s, 5m, 30m
	// (30s → 5m → 30m), run on the virtual clock.
	TierDelays []time.Duration
	// Broker replaces the kit's in-memory broker by a real one (the
	// project's own tests give rabbitmq.NewBroker with a shortened ladder):
	// the same stages run, the same traces are kept, but its tiers wait in
	// real time — Advance sleeps and Settle waits. Publish then needs
	// Input.
	Broker broker.Broker
	// Input publishes a test's messages into Broker's queue. Required with
	// Broker; the kit's is its broker's topic.
	Input message.Publisher
	// Logger receives the router's and the stages' logs. Default none.
	Logger watermill.LoggerAdapter
	// IdleTimeout bounds, in real time, each wait for the handler to finish
	// what it was given. Default 30 s.
	IdleTimeout time.Duration
	// SettleLimit bounds the virtual time Settle advances. Default 24 h of
	// virtual time.
	SettleLimit time.Duration
}

// Harness runs one handler through the stages a service gives it
// (service.Handler: router.Add's assembly, with the production defaults),
// on the kit's in-memory broker — the embedded default with its retry
// tiers and the brake's cool-downs on a virtual clock — and the inbox,
// outbox and replay tables of a real database. It keeps a Trace per
// published message and injects faults. Build it with New; it closes with
// the test. Its methods are safe for concurrent use.
type Harness struct {
	t     testing.TB
	cfg   Config
	name  string
	clock *virtualClock // nil on a real broker
	emb   *embedded.Broker
	brk   broker.Broker
	tiers []broker.Tier
	topic string
	input message.Publisher
	db    *sqlx.DB
	r     *message.Router
	svc   *service.Service
	done  chan error
	start time.Time // real time, with a real broker

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced at every change
	traces   map[string]Trace
	subjects []string
	current  map[string][]*delivery // by subject, in the order they began
	active   int
	relayed  []*message.Message
	faults   faults
	closed   bool
	shutErr  error
}

// New starts a harness for cfg's handler and closes it when t ends. It
// fails t when the handler cannot be added (router.Add's refusals,
// router.ErrUnsafeStages, hold).
func New(t testing.TB, cfg Config) *Harness {
	t.Helper()
	h, err := newHarness(t, cfg)
	if err != nil {
		t.Fatalf("sluicetest: %v", err)
	}
	return h
}

func newHarness(t testing.TB, cfg Config) (_ *Harness, err error) {
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, idleTimeoutDefault)
	cfg.SettleLimit = cmp.Or(cfg.SettleLimit, settleLimitDefault)
	cfg.Logger = cmp.Or[watermill.LoggerAdapter](cfg.Logger, watermill.NopLogger{})
	if cfg.Handler.Broker != nil {
		return nil, errors.New("Config.Handler.Broker must be nil: the kit gives the broker (Config.Broker replaces it)")
	}
	if cfg.Broker != nil && cfg.Input == nil {
		return nil, errors.New("Config.Input is required with Config.Broker")
	}
	h := &Harness{t: t, cfg: cfg, name: cmp.Or(cfg.Handler.Name, nameDefault), changed: make(chan struct{}),
		traces: map[string]Trace{}, current: map[string][]*delivery{}, done: make(chan error, 1), start: time.Now()}
	ctx := context.Background()
	var closers []func() error
	defer func() {
		if err != nil {
			for _, c := range slices.Backward(closers) {
				_ = c()
			}
		}
	}()

	if cfg.Broker == nil {
		h.clock = newVirtualClock(epoch)
		h.emb, err = embedded.New(embedded.Config{Topic: cmp.Or(cfg.Topic, topicDefault), TierDelays: cfg.TierDelays,
			Env: sluice.Env{Logger: cfg.Logger, Clock: h.clock}, DrainTimeout: cfg.IdleTimeout})
		if err != nil {
			return nil, err
		}
		closers = append(closers, h.closeBroker)
		cfg.Broker, h.input = h.emb, h.emb.PubSub().Publisher()
	} else {
		h.input = cfg.Input
	}
	e := cfg.Broker.Endpoints()
	h.topic, h.tiers = e.Topic, e.Tiers
	h.brk = kitBroker{inner: cfg.Broker, h: h}

	h.db = cfg.DB
	if h.db == nil {
		if h.db, err = openSQLite(ctx, filepath.Join(t.TempDir(), "sluicetest.db"),
			func() bool { return h.faults.take(&h.mu, faultCommit) }, h.wallNow); err != nil {
			return nil, err
		}
		closers = append(closers, h.db.Close)
	}
	if cfg.Setup != nil {
		if err := cfg.Setup(ctx, h.db); err != nil {
			return nil, fmt.Errorf("Config.Setup: %w", err)
		}
	}

	h.r, err = message.NewRouter(message.RouterConfig{CloseTimeout: cfg.IdleTimeout}, cfg.Logger)
	if err != nil {
		return nil, err
	}
	closers = append(closers, h.r.Close)
	h.r.AddMiddleware(h.observe) // outermost: sees what reaches the router
	if cfg.Schema == "" && (h.db.DriverName() == "postgres" || h.db.DriverName() == "pgx") {
		read, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := h.db.GetContext(read, &cfg.Schema, `SELECT current_schema()`)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("sluicetest: reading the connection's current schema (Config.Schema): %w", err)
		}
	}
	h.svc, err = service.New(service.Config{DB: h.db, Schema: cfg.Schema, Router: h.r, Publisher: relayPublisher{h}, Env: sluice.Env{Logger: cfg.Logger}})
	if err != nil {
		return nil, err
	}
	closers = append(closers, h.svc.Close)
	if err := h.svc.Stores().Migrate(ctx); err != nil {
		return nil, err
	}
	if err := h.svc.Add(h.handler()); err != nil {
		return nil, err
	}
	go func() { h.done <- h.r.Run(context.Background()) }()
	select {
	case <-h.r.Running():
	case err := <-h.done:
		return nil, fmt.Errorf("the router stopped: %w", err)
	}
	t.Cleanup(h.cleanup)
	return h, nil
}

// handler returns cfg's handler with the kit's broker, its handler wrapped
// to see it run, and the stages the kit times on its clock.
func (h *Harness) handler() service.Handler {
	sh := h.cfg.Handler
	sh.Name, sh.Broker = h.name, h.brk
	switch {
	case sh.Handler != nil:
		inner := sh.Handler
		sh.Handler = func(msg *message.Message) error {
			h.ran(msg)
			return inner(msg)
		}
	case sh.BatchHandler != nil:
		bh := *sh.BatchHandler
		inner := bh.Handle
		bh.Handle = func(ctx context.Context, msgs []*message.Message) []error {
			for _, m := range msgs {
				h.ran(m)
			}
			return inner(ctx, msgs)
		}
		sh.BatchHandler = &bh
	case sh.PublishingHandler != nil:
		inner := sh.PublishingHandler
		sh.PublishingHandler = func(msg *message.Message) ([]*message.Message, error) {
			h.ran(msg)
			out, err := inner(msg)
			h.produced(msg, out)
			return out, err
		}
	}
	if sh.OrderBy != nil || sh.Stages.Order != nil {
		var oc ordering.Config
		if sh.Stages.Order != nil {
			oc = *sh.Stages.Order
		}
		if oc.Store == nil && h.db.DriverName() != "postgres" {
			// On SQLite the kit keeps the held messages in memory (the
			// service's store needs PostgreSQL): a faithful model within one
			// test, where nothing restarts the process.
			oc.Store = ordering.NewMemoryStore()
		}
		// A released message runs through the stages inside Order, not
		// the router's middleware: the kit sees it there, as a step of
		// its own subject's trace.
		if oc.Released == nil {
			oc.Released = h.observe
		}
		sh.Stages.Order = &oc
	}
	if h.clock != nil {
		if sh.Stages.ShutdownGrace == 0 {
			sh.Stages.ShutdownGrace = shutdownGraceDefault
		}
		if !slices.Contains(sh.Without, "Brake") {
			b := brake.Config{Match: brake.MatchUnreachable} // the service's default (service.Service.Defaults)
			if sh.Stages.Brake != nil {
				b = *sh.Stages.Brake
			}
			b.Clock = h.clock
			sh.Stages.Brake = &b
		}
		// The retry and poison stages stamp their copies on it too: the
		// handler's Env gives it to each stage whose own Clock is unset.
		sh.Stages.Clock = h.clock
	}
	return sh
}

// DB returns the database of the inbox and of the handler's tables.
func (h *Harness) DB() *sqlx.DB { return h.db }

// Service returns the service the handler runs in: its Stores hold the
// inbox, outbox and replay tables.
func (h *Harness) Service() *service.Service { return h.svc }

// Broker returns the broker the handler was added with: its Endpoints are
// what router.Add gave the stages (the copies' publishers seen by the kit),
// for a test that wires a stage of its own.
func (h *Harness) Broker() broker.Broker { return h.brk }

// Clock returns the virtual clock (it starts at 2030-01-01 00:00 UTC; it
// moves only when Advance or Settle move it: the retry tiers' delays and the
// brake's cool-downs wait on it), or nil on a real broker.
func (h *Harness) Clock() sluice.Clock {
	if h.clock == nil {
		return nil // not a nil *virtualClock in an interface
	}
	return h.clock
}

// wallNow is the clock's time: the virtual clock's, or the real one.
func (h *Harness) wallNow() time.Time {
	if h.clock == nil {
		return time.Now()
	}
	return h.clock.Now()
}

// Now returns how much virtual time has passed since the harness started
// (real time on a real broker).
func (h *Harness) Now() time.Duration {
	if h.clock == nil {
		return time.Since(h.start)
	}
	return h.clock.Now().Sub(epoch)
}

// Message returns a message with eventID in sluice_event_id, the inbox's
// default key.
func Message(eventID string, payload []byte) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set(sluice.EventIDKey, eventID)
	return m
}

// Publish publishes msg to the handler's queue under subject, the name its
// Trace is kept under; each subject names one publish. It returns at once:
// Advance or Settle runs what follows.
func (h *Harness) Publish(subject string, msg *message.Message) {
	h.t.Helper()
	if err := h.publish(subject, msg); err != nil {
		h.t.Fatalf("sluicetest: Publish %q: %v", subject, err)
	}
}

func (h *Harness) publish(subject string, msg *message.Message) error {
	if subject == "" {
		return errors.New("a subject is required")
	}
	h.mu.Lock()
	if _, ok := h.traces[subject]; ok {
		h.mu.Unlock()
		return errors.New("the subject names an earlier publish: give each publish a subject of its own")
	}
	h.traces[subject] = nil
	h.subjects = append(h.subjects, subject)
	if h.faults.published == nil {
		h.faults.published = map[string]*message.Message{}
	}
	h.faults.published[subject] = msg.Copy()
	h.mu.Unlock()
	m := msg.Copy()
	m.Metadata.Set(subjectKey, subject)
	return h.input.Publish(h.topic, m)
}

// Redeliver publishes the message first published under subject again,
// under again: the broker's duplicate delivery of one event.
func (h *Harness) Redeliver(subject, again string) {
	h.t.Helper()
	m, ok := h.original(subject)
	if !ok {
		h.t.Fatalf("sluicetest: Redeliver: nothing was published under %q", subject)
	}
	h.Publish(again, m)
}

// cleanup closes the router, the service, the broker and the database.
func (h *Harness) cleanup() {
	if err := h.Shutdown(); err != nil {
		h.t.Errorf("sluicetest: closing: %v", err)
	}
}

// Shutdown closes the router as a service's shutdown does — a handler in
// flight gets the ShutdownGrace stage's grace (100 ms on the
// kit), then its context ends and the delivery goes back unprocessed
// (requeued) — and waits until it stopped. What the kit's broker holds
// then is reported by Unfinished. Idempotent; the test's end calls it.
func (h *Harness) Shutdown() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return h.shutErr
	}
	h.closed = true
	h.mu.Unlock()
	err := h.svc.Close()
	if rerr := <-h.done; rerr != nil {
		err = errors.Join(err, rerr)
	}
	h.signal()
	if h.emb != nil {
		err = errors.Join(err, h.closeBroker())
	}
	if h.cfg.DB == nil {
		err = errors.Join(err, h.db.Close())
	}
	h.mu.Lock()
	h.shutErr = err
	h.mu.Unlock()
	return err
}

// closeBroker closes the kit's broker; what it did not finish is kept for
// Unfinished, not an error.
func (h *Harness) closeBroker() error {
	err := h.emb.Close()
	var u *embedded.UnfinishedError
	if errors.As(err, &u) {
		h.mu.Lock()
		h.faults.unfinished = slices.Concat(u.Queued, u.InFlight, u.Tiers)
		h.mu.Unlock()
		return nil
	}
	return err
}

// Unfinished returns the subjects of the deliveries the kit's broker still
// held when the harness shut down (a shutdown mid-handler gives its
// delivery back: it waits in the queue).
func (h *Harness) Unfinished() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, m := range h.faults.unfinished {
		out = append(out, m.Metadata.Get(subjectKey))
	}
	return out
}

// kitBroker is the broker the handler is added with: the kit's or the
// test's, its copies' publishers observed and faulted by the harness.
type kitBroker struct {
	inner broker.Broker
	h     *Harness
}

func (b kitBroker) Endpoints() broker.Endpoints {
	e := b.inner.Endpoints()
	e.RetryPublisher = copyPublisher{e.RetryPublisher, b.h, ToTier}
	e.PoisonPublisher = copyPublisher{e.PoisonPublisher, b.h, ToPoison}
	return e
}

// signal wakes the waiters (h.mu not held).
func (h *Harness) signal() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.changed)
	h.changed = make(chan struct{})
}

// brakeEngaged reports whether the handler's brake holds its deliveries.
func (h *Harness) brakeEngaged() bool {
	b := router.Brake(h.r, h.name)
	if b == nil {
		return false
	}
	engaged, _ := b.Engaged()
	return engaged
}
