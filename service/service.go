package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// errClosed is the error of Add after Close, and of the router's Run when
// the service closed before it ran.
var errClosed = errors.New("service: closed")

// Service is a production service on one router, one database and any
// number of brokers: its handlers, the outbox relay, the pruners and the
// health report. Safe for concurrent use.
type Service struct {
	cfg     Config
	stores  *sluicesql.Stores
	relay   *outbox.Relay        // nil without Config.Publisher
	pruners [2]*sluicesql.Pruner // the inbox's, the replay outcomes'
	calls   *bounded.Calls       // the health checks' and the drain's store calls

	mu       sync.Mutex
	handlers []added
	started  bool // the router ran the service's plugin
	closed   bool
	closing  chan struct{} // closed by Close
	stopping chan struct{} // closed once the router has closed: the service stops
	done     chan struct{} // closed once what start started has stopped
	relayRun chan struct{} // closed when the relay's Run returned
	cancel   context.CancelFunc
	errs     []error // what stopping the relay and the pruners returned
	once     sync.Once
}

// added is a handler Add added: its name, its router handlers (one per
// consumer) and the broker's subscriber.
type added struct {
	name       string
	handlers   []*message.Handler
	subscriber message.Subscriber
}

// New validates cfg, builds Sluice's stores on its database, and makes the
// router start the relay and the pruners when it runs. It does not touch
// the database: Stores().Migrate creates the tables.
func New(cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, stores: cfg.Stores, closing: make(chan struct{}), stopping: make(chan struct{}), done: make(chan struct{}),
		calls: &bounded.Calls{Max: 8, Grace: 100 * time.Millisecond, Timeout: context.DeadlineExceeded}}
	if s.stores == nil {
		var err error
		// What the relay's publisher could never publish is refused when
		// a handler writes it: its delivery is poison, not a row failing
		// for ever.
		checker, _ := cfg.Publisher.(broker.PublishChecker)
		if s.stores, err = sluicesql.New(cfg.DB, sluicesql.Config{Schema: cfg.Schema, Outbox: sluicesql.OutboxConfig{Checker: checker}}); err != nil {
			return nil, fmt.Errorf("service: %w", err)
		}
	}
	if risk := stallRisk(s.stores.DB()); risk != "" {
		cfg.Logger.Error("service: a database pool that may not recover from a network fault", nil, watermill.LogFields{"why": risk})
	}
	if cfg.Publisher != nil {
		relay, err := outbox.NewRelay(s.stores.Outbox, cfg.Publisher, cfg.Relay)
		if err != nil {
			return nil, fmt.Errorf("service: Config.Relay: %w", err)
		}
		s.relay = relay
	}
	var err error
	s.pruners[0], err = sluicesql.NewPruner(sluicesql.PrunerConfig{Store: s.stores.Inbox, Retention: cfg.InboxRetention,
		ReplayWindow: cfg.ReplayWindow, Interval: cfg.PruneInterval, Env: sluice.Env{Logger: cfg.Logger, MeterProvider: cfg.MeterProvider}})
	if err != nil {
		return nil, fmt.Errorf("service: Config.InboxRetention: %w", err)
	}
	// Its deletions are not the inbox's: sluice.inbox.pruned counts the
	// inbox's alone.
	s.pruners[1], err = sluicesql.NewPruner(sluicesql.PrunerConfig{Store: s.stores.Outcomes, Retention: cfg.OutcomeRetention,
		Interval: cfg.PruneInterval, Env: sluice.Env{Logger: cfg.Logger, MeterProvider: noop.NewMeterProvider()}})
	if err != nil {
		return nil, fmt.Errorf("service: Config.OutcomeRetention: %w", err)
	}
	cfg.Router.AddPlugin(func(*message.Router) error { return s.start() })
	return s, nil
}

// Stores are the service's tables: the inbox, the outbox (whose Write a
// service uses to produce in a transaction of its own) and the replay
// outcomes. Their Migrate creates every table Sluice needs where it does not
// exist (idempotent, safe from several instances at once).
func (s *Service) Stores() *sluicesql.Stores { return s.stores }

// Add adds h to the router with its stages (Handler, Defaults), before the
// router runs. It refuses what router.Add refuses — an assembly that
// cannot keep the promise among them (router.ErrUnsafeStages) — and an
// InboxRetention shorter than the handler's retry ladder plus ReplayWindow.
func (s *Service) Add(h Handler) error {
	if err := s.validate(h); err != nil {
		return err
	}
	st, err := s.stages(h)
	if err != nil {
		return err
	}
	if err := s.checkRetention(h, st); err != nil {
		return err
	}
	cfg := router.HandlerConfig{Name: h.Name, Broker: h.Broker, Handler: h.Handler, BatchHandler: h.BatchHandler, Consumers: h.Consumers, Stages: st}
	if h.PublishingHandler != nil {
		cfg.PublishingHandler, cfg.PublishTopic, cfg.Outbox = h.PublishingHandler, h.PublishTopic, s.stores.Outbox
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errClosed
	case s.started:
		return fmt.Errorf("service: Add handler %q before the router runs", h.Name)
	}
	hs, err := router.Add(s.cfg.Router, cfg)
	if err != nil {
		return fmt.Errorf("service: handler %q: %w", h.Name, err)
	}
	if s.relay != nil && h.PublishingHandler != nil {
		s.relay.ExportCountersAtZero(h.PublishTopic) // its counters, for the alerts' rate(), before the first row
	}
	s.handlers = append(s.handlers, added{name: h.Name, handlers: hs, subscriber: h.Broker.Endpoints().Subscriber})
	return nil
}

// start starts the relay and the pruners: the router's plugin, when it runs.
func (s *Service) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errClosed
	case s.started:
		return nil
	}
	s.started = true
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if s.relay != nil {
		s.relayRun = make(chan struct{})
		go func() {
			defer close(s.relayRun)
			if err := s.relay.Run(ctx); err != nil {
				s.cfg.Logger.Error("The outbox relay stopped", err, nil)
			}
		}()
	}
	for _, p := range s.pruners {
		if err := p.Start(ctx); err != nil {
			cancel()
			return err
		}
	}
	go s.watch()
	return nil
}

// watch stops what start started once the handlers stopped writing: when
// the router has closed (or Close was called), it drains the relay and
// stops it and the pruners.
func (s *Service) watch() {
	defer close(s.done)
	select {
	case <-s.cfg.Router.Running():
		s.waitStopped()
	case <-s.closing:
	}
	// The router's close done (IsClosed waits for a Close in progress):
	// no handler of it is running any more.
	for !s.cfg.Router.IsClosed() {
		t := time.NewTimer(time.Second)
		select {
		case <-s.closing:
		case <-t.C:
		}
		t.Stop()
	}
	close(s.stopping)
	s.drain()
	var errs []error
	if s.relay != nil {
		errs = append(errs, s.relay.Close())
		<-s.relayRun
	}
	for _, p := range s.pruners {
		errs = append(errs, p.Close())
	}
	s.cancel()
	s.mu.Lock()
	s.errs = errs
	s.mu.Unlock()
}

// waitStopped waits until every handler the service added has stopped, or
// Close. Called once the router runs (its handlers' Stopped channels set).
func (s *Service) waitStopped() {
	s.mu.Lock()
	var stopped []chan struct{}
	for _, a := range s.handlers {
		for _, h := range a.handlers {
			stopped = append(stopped, h.Stopped())
		}
	}
	s.mu.Unlock()
	if len(stopped) == 0 {
		<-s.closing
		return
	}
	for _, c := range stopped {
		select {
		case <-c:
		case <-s.closing:
			return
		}
	}
}

// drainPoll is how often the drain reads the outbox's counts.
const drainPoll = 20 * time.Millisecond

// drain wakes the relay until no row is due (every row left has failed and
// waits for its retry) or DrainTimeout passes.
func (s *Service) drain() {
	if s.relay == nil {
		return
	}
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	for {
		s.stores.Outbox.Wake() // the relay's store: it wakes the relay
		st, err := s.outboxStats(context.Background(), time.Until(deadline))
		if err == nil && st.Pending <= st.Failing {
			return
		}
		if time.Until(deadline) <= drainPoll {
			if err == nil {
				err = fmt.Errorf("%d rows not relayed", st.Pending-st.Failing)
			}
			s.cfg.Logger.Error("The outbox's drain ran out of time: the rows left wait for the next start", err, watermill.LogFields{"timeout": s.cfg.DrainTimeout.String()})
			return
		}
		time.Sleep(drainPoll)
	}
}

// outboxStats reads the outbox's counts, waiting at most bound.
func (s *Service) outboxStats(ctx context.Context, bound time.Duration) (outbox.Stats, error) {
	st, _, err := bounded.Run(s.calls, ctx, max(bound, time.Millisecond), false, s.stores.Outbox.Stats, nil)
	return st, err
}

// Close closes the router when it ran (its handlers finish what they hold,
// within its CloseTimeout), then drains the outbox — the rows the handlers committed
// are published, at most DrainTimeout — and stops the relay and the
// pruners. Close the brokers after it. It is idempotent; call it even when
// the router closed by itself, to wait for the drain.
func (s *Service) Close() error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		started := s.started
		s.mu.Unlock()
		close(s.closing)
		if !started { // the router never ran the service: its Run now fails
			return
		}
		err = s.cfg.Router.Close()
		<-s.done
		s.mu.Lock()
		err = errors.Join(append([]error{err}, s.errs...)...)
		s.mu.Unlock()
	})
	return err
}

// stallRisk says why db's calls may hang for good after a network fault
// that swallows packets rather than refusing them — a black hole that heals
// without resetting the connections it caught: db is a lib/pq pool (driver
// "postgres") not opened by sluicesql/postgres.Open. lib/pq does not end a
// read whose context has ended, nor bound a connection's start-up without
// connect_timeout, so each call such a fault catches never returns; what
// Sluice bounds around its calls then gives up on them, and once the calls
// given up fill their bound (or the pool's cap), the inbox, the brake's
// probe, the health check's ping and the relay wait for good: /readyz fails
// until the process restarts. "" when no such risk is known (Open's pool,
// pgx, SQLite). New logs it.
func stallRisk(db *sqlx.DB) string {
	if db == nil || db.DriverName() != "postgres" {
		return ""
	}
	if _, ok := db.Driver().(interface{ BoundsEveryWait() }); ok {
		return ""
	}
	return "the database pool is lib/pq's (driver \"postgres\") but not opened by sluicesql/postgres.Open: its calls are not bounded, " +
		"and after a network fault that swallows packets (a black hole that heals without resetting the connections it caught) " +
		"the service can stop consuming for good while /livez passes — open it with postgres.Open (docs/production.md)"
}
