package embedded

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
)

// Defaults of Config.
const (
	// maxQueuedDefault is Config.MaxQueued's default.
	maxQueuedDefault = 10_000
	// maxInFlightDefault is Config.MaxInFlight's default.
	maxInFlightDefault = 64
	// drainTimeoutDefault is Config.DrainTimeout's default.
	drainTimeoutDefault = 30 * time.Second
)

// Config configures the embedded default of one consumer topic.
type Config struct {
	// Topic the handler consumes. Required.
	Topic string
	// TierDelays of the in-process retry tiers. Default 30s, 5m, 30m.
	TierDelays []time.Duration
	// TierJitter spreads each tier's copies over several waits
	// (broker.Jittered), as rabbitmq.TopologyConfig.TierJitter does. Default
	// none.
	TierJitter broker.Jitter
	// Env is the broker's environment (a sluice.Env: give the stages' own).
	// It reads Logger (default watermill.NopLogger) and Clock, which times
	// the retry tiers' delays (default sluice.SystemClock(); the test kit,
	// package sluicetest, gives its virtual clock).
	sluice.Env
	// MaxPendingRetries bounds the copies waiting in the in-process tiers
	// (DelayedPublisherConfig.MaxPending); beyond it the retry
	// stage nacks. Default 10,000.
	MaxPendingRetries int
	// MaxQueued bounds the deliveries one topic holds, queued or in a
	// handler; a Publish beyond it fails with ErrFull (the copies
	// back from the tiers and the nacked deliveries are never refused:
	// MaxPendingRetries bounds the first, the second were counted
	// already). Default 10,000.
	MaxQueued int
	// MaxInFlight is how many deliveries one subscription hands out before
	// the first is acked or nacked (a prefetch). Default 64.
	MaxInFlight int
	// DrainTimeout bounds a closing subscription's wait for its deliveries
	// in flight to be acked or nacked; what is still in a handler then is
	// reported by Close. Keep it above the handlers' ShutdownGrace. Default 30 s.
	DrainTimeout time.Duration
}

// withDefaults returns a copy of c with its defaults filled;
// MaxPendingRetries and TierDelays are defaulted by NewDelayedPublisher and
// broker.Ladder.
func (c Config) withDefaults() Config {
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	c.MaxQueued = cmp.Or(c.MaxQueued, maxQueuedDefault)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, maxInFlightDefault)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, drainTimeoutDefault)
	return c
}

// validate checks a Config with its defaults filled.
func (c Config) validate() error {
	switch {
	case c.Topic == "":
		return errors.New("embedded: Config.Topic is required")
	case c.MaxQueued < 0:
		return fmt.Errorf("embedded: Config.MaxQueued must be positive, got %d", c.MaxQueued)
	case c.MaxInFlight < 0:
		return fmt.Errorf("embedded: Config.MaxInFlight must be positive, got %d", c.MaxInFlight)
	case c.DrainTimeout < 0:
		return fmt.Errorf("embedded: Config.DrainTimeout must be positive, got %s", c.DrainTimeout)
	}
	return nil
}

// Broker is the embedded default: an in-process broker of Sluice's own
// (PubSub: bounded queues, every delivery tracked until acked),
// in-process retry tiers (DelayedPublisher — bounded, not
// durable) and an in-memory poison topic that can be read back (Poisoned).
// For development, examples and tests; RabbitMQ is the durable counterpart.
//
// Nothing it holds is dropped silently. A message published with no
// handler running waits in its topic; a copy whose delay ends after the
// router closed waits there too. Close the router first: its Close drains
// the handler's subscription (no handler runs after it returns, unless the
// drain timed out), and Broker.Close then reports every delivery not
// acked in an *UnfinishedError, with the copies still waiting in a tier.
type Broker struct {
	cfg     Config
	pubsub  *PubSub
	delayed *DelayedPublisher
	tiers   []broker.Tier

	mu       sync.Mutex
	poisoned []*message.Message
}

// New starts the in-process broker and tiers.
func New(cfg Config) (*Broker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tiers, err := broker.Ladder(cfg.Topic, cfg.TierDelays...)
	if err != nil {
		return nil, err
	}
	if tiers, err = broker.Jittered(cfg.Topic, tiers, cfg.TierJitter); err != nil {
		return nil, fmt.Errorf("embedded: Config.TierJitter: %w", err)
	}
	e := &Broker{cfg: cfg, pubsub: newPubSub(cfg), tiers: tiers}
	e.pubsub.sinks[e.poisonTopic()] = e.storePoisoned
	e.delayed, err = NewDelayedPublisher(DelayedPublisherConfig{
		Target: embeddedPublisher{e.pubsub, true}, Routes: Routes(cfg.Topic, tiers), Env: sluice.Env{Logger: cfg.Logger, Clock: cfg.Clock},
		MaxPending: cfg.MaxPendingRetries,
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// PubSub returns the in-process broker: publish the handler's input to it
// (Publisher), or subscribe to a topic no handler of Add consumes.
func (e *Broker) PubSub() *PubSub { return e.pubsub }

// PendingRetries returns how many copies wait in the in-process tiers.
func (e *Broker) PendingRetries() int { return e.delayed.Pending() }

// Poisoned returns the messages isolated in the poison topic so far.
func (e *Broker) Poisoned() []*message.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*message.Message(nil), e.poisoned...)
}

// storePoisoned is the poison topic: a publish to it returns once the
// copies are stored here, as Endpoints.PoisonPublisher promises.
func (e *Broker) storePoisoned(msgs ...*message.Message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range msgs {
		e.poisoned = append(e.poisoned, m.Copy())
	}
}

var _ broker.Broker = (*Broker)(nil)

// poisonTopic is the in-memory poison topic: "<Topic>.poison".
func (e *Broker) poisonTopic() string { return e.cfg.Topic + ".poison" }

// Endpoints are the embedded topic's: a subscriber of PubSub whose Close
// drains the handler's subscriptions, PubSub as poison publisher to the
// poison topic "<Topic>.poison" (stored before Publish returns), the
// in-process tiers as retry publisher, System "gochannel" (the label it had
// on Watermill's GoChannel, kept so that dashboards and alerts on
// messaging.system keep matching) and one consumer at most.
func (e *Broker) Endpoints() broker.Endpoints {
	return broker.Endpoints{
		System: "gochannel", Topic: e.cfg.Topic, Subscriber: e.pubsub.subscriber(),
		Tiers: append([]broker.Tier(nil), e.tiers...), RetryPublisher: e.delayed,
		PoisonTopic: e.poisonTopic(), PoisonPublisher: e.pubsub,
		Consumers: 1, MaxConsumers: 1,
	}
}

// Close stops the tiers (dropping the copies still waiting, and saying how
// many), then the broker, draining what is still subscribed; close the
// router first. Its error joins the tiers' count with an *UnfinishedError
// (errors.As) naming every delivery not acked — queued, nacked back, or
// still in a handler. Idempotent.
func (e *Broker) Close() error {
	// One *UnfinishedError for both: what the topics and the tiers did not
	// finish, so that a caller keeping its messages gets them all.
	derr, perr := e.delayed.Close(), e.pubsub.Close()
	var du, pu *UnfinishedError
	if errors.As(derr, &du) {
		derr = nil
	}
	if errors.As(perr, &pu) {
		perr = nil
	}
	if u := merge(pu, du); u != nil {
		return errors.Join(u, derr, perr)
	}
	return errors.Join(derr, perr)
}
