package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/metakeys"
)

// Route sends what is published to From on to To after Delay.
type Route struct {
	From  string
	Delay time.Duration
	To    string
}

// Routes returns the routes of tiers back to the consumer's queue (topic):
// one per tier, or per wait of a jittered tier (broker.Jittered).
func Routes(queue string, tiers []broker.Tier) []Route {
	rs := make([]Route, 0, len(tiers))
	for _, t := range tiers {
		if len(t.Waits) == 0 {
			rs = append(rs, Route{From: t.Topic, Delay: t.Delay, To: queue})
		}
		for _, w := range t.Waits {
			rs = append(rs, Route{From: w.Topic, Delay: w.Delay, To: queue})
		}
	}
	return rs
}

// DelayedPublisherConfig configures a DelayedPublisher.
type DelayedPublisherConfig struct {
	// Target receives the messages when their delay is over. Required.
	Target message.Publisher
	// Routes maps each tier topic to its delay and destination. Required.
	Routes []Route
	// Env is the publisher's environment (a sluice.Env). It reads Logger,
	// which reports deliveries to Target that failed (default
	// watermill.NopLogger), and Clock, which times the delays (default
	// sluice.SystemClock(); the test kit, package sluicetest, gives its
	// virtual clock).
	sluice.Env
	// MaxPending bounds the messages waiting for their delay (each holds its
	// payload and metadata in memory). Publish beyond it fails with an
	// error matching ErrFull, so the retry stage nacks the original after
	// its backoff: back-pressure instead of unbounded memory. Default 10,000.
	MaxPending int
}

// maxPendingDefault is DelayedPublisherConfig.MaxPending's default.
const maxPendingDefault = 10_000

// errDelayedPublisherFull and errDelayedPublisherClosed are what Publish
// returns when MaxPending messages already wait, and after Close: they
// match ErrFull and errClosed.
var (
	errDelayedPublisherFull   = fmt.Errorf("embedded: delayed publisher full: %w", ErrFull)
	errDelayedPublisherClosed = fmt.Errorf("embedded: delayed publisher closed: %w", errClosed)
)

// DelayedPublisher is an in-process message.Publisher for the retry tiers of
// the embedded default and of tests: a message published to a route's From
// topic is published to its To topic on Target after the route's Delay.
//
// A message delivered to To carries sluice_amqp_last_death_queue (its From
// topic) and sluice_amqp_last_death_reason ("expired"), as a copy back from a
// RabbitMQ TTL tier carries them from x-death. It is NOT durable: messages
// waiting for their delay live in memory and are lost if the process stops —
// Close drops them and reports how many. Use RabbitMQ's TTL queues in
// production. Publishing to a topic without a route is an error. It is safe
// for concurrent use.
type DelayedPublisher struct {
	cfg    DelayedPublisherConfig
	routes map[string]Route

	mu      sync.Mutex
	closed  bool
	failed  []*message.Message // copies Target refused: handed back by Close
	pending map[sluice.Timer]*message.Message
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

var _ message.Publisher = (*DelayedPublisher)(nil)

// withDefaults returns a copy of c with its defaults filled.
func (c DelayedPublisherConfig) withDefaults() DelayedPublisherConfig {
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	c.MaxPending = cmp.Or(c.MaxPending, maxPendingDefault)
	c.Clock = cmp.Or(c.Clock, sluice.SystemClock())
	return c
}

// validate checks a DelayedPublisherConfig with its defaults filled.
func (c DelayedPublisherConfig) validate() error {
	if c.Target == nil {
		return errors.New("embedded: DelayedPublisherConfig.Target is required")
	}
	if len(c.Routes) == 0 {
		return errors.New("embedded: DelayedPublisherConfig.Routes is required (see Routes)")
	}
	if c.MaxPending < 0 {
		return fmt.Errorf("embedded: DelayedPublisherConfig.MaxPending must be positive, got %d", c.MaxPending)
	}
	for i, r := range c.Routes {
		if r.From == "" || r.To == "" || r.Delay < 0 {
			return fmt.Errorf("embedded: DelayedPublisherConfig.Routes[%d] needs From, To and a delay that is not negative", i)
		}
	}
	return nil
}

// NewDelayedPublisher validates cfg and returns a DelayedPublisher.
func NewDelayedPublisher(cfg DelayedPublisherConfig) (*DelayedPublisher, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	routes := make(map[string]Route, len(cfg.Routes))
	for _, r := range cfg.Routes {
		routes[r.From] = r
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &DelayedPublisher{cfg: cfg, routes: routes, pending: map[sluice.Timer]*message.Message{}, ctx: ctx, cancel: cancel}, nil
}

// Publish schedules msgs for their route's destination and returns at once.
func (p *DelayedPublisher) Publish(topic string, msgs ...*message.Message) error {
	r, ok := p.routes[topic]
	if !ok {
		return fmt.Errorf("embedded: no delayed route from topic %q", topic)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errDelayedPublisherClosed
	}
	if len(p.pending)+len(msgs) > p.cfg.MaxPending {
		return fmt.Errorf("%w: %d messages wait (MaxPending %d)", errDelayedPublisherFull, len(p.pending), p.cfg.MaxPending)
	}
	for _, msg := range msgs {
		c := msg.Copy() // the caller may reuse msg; the context is not kept
		// What x-death says of a copy back from a RabbitMQ tier: the
		// stages' keyless proof that Sluice wrote its retry history.
		c.Metadata[metakeys.DeadLetterQueue] = r.From
		c.Metadata[metakeys.DeadLetterReason] = metakeys.DeadLetterExpired
		// The callback takes p.mu first, so it sees t and its pending entry
		// even with a zero delay: Publish holds p.mu until both are set.
		var t sluice.Timer
		p.wg.Add(1)
		t = p.cfg.Clock.AfterFunc(r.Delay, func() {
			defer p.wg.Done()
			p.mu.Lock()
			_, live := p.pending[t]
			delete(p.pending, t)
			p.mu.Unlock()
			if !live {
				return
			}
			c.SetContext(p.ctx)
			if err := p.cfg.Target.Publish(r.To, c); err != nil {
				p.mu.Lock()
				p.failed = append(p.failed, c)
				p.mu.Unlock()
				p.cfg.Logger.Error("Delivering a delayed retry copy failed; it is dropped (not durable)", err,
					watermill.LogFields{"from": r.From, "to": r.To, "message_uuid": c.UUID})
			}
		})
		p.pending[t] = c
	}
	return nil
}

// Pending returns how many messages wait for their delay.
func (p *DelayedPublisher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// Close stops the timers, waits for deliveries in progress and returns an
// *UnfinishedError holding the copies it did not deliver (Tiers): those
// still waiting, and those whose delivery to Target failed — so a caller
// can keep them. It is idempotent.
func (p *DelayedPublisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var waiting []*message.Message
	for t, c := range p.pending {
		if t.Stop() {
			p.wg.Done() // its callback will not run
		} // else it runs, finds itself gone, and returns
		delete(p.pending, t)
		waiting = append(waiting, c)
	}
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	failed := p.failed
	p.mu.Unlock()
	if len(waiting)+len(failed) > 0 {
		return &UnfinishedError{Tiers: append(waiting, failed...), tiersWaiting: len(waiting)}
	}
	return nil
}
