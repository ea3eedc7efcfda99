package router

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/retrytiers"
)

// Defaults of EmbeddedConfig.
const (
	// EmbeddedMaxQueuedDefault is EmbeddedConfig.MaxQueued's default.
	EmbeddedMaxQueuedDefault = 10_000
	// EmbeddedMaxInFlightDefault is EmbeddedConfig.MaxInFlight's default.
	EmbeddedMaxInFlightDefault = 64
	// EmbeddedDrainTimeoutDefault is EmbeddedConfig.DrainTimeout's default.
	EmbeddedDrainTimeoutDefault = 30 * time.Second
)

// EmbeddedConfig configures the embedded default of one consumer topic.
type EmbeddedConfig struct {
	// Topic the handler consumes. Required.
	Topic string
	// TierDelays of the in-process retry tiers. Default retrytiers.DelaysDefault.
	TierDelays []time.Duration
	// PoisonTopic. Default "<Topic>.poison".
	PoisonTopic string
	// Logger. Default watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// MaxPendingRetries bounds the copies waiting in the in-process tiers
	// (retrytiers.DelayedPublisherConfig.MaxPending); beyond it the retry
	// stage nacks. Default retrytiers.MaxPendingDefault.
	MaxPendingRetries int
	// MaxQueued bounds the deliveries one topic holds, queued or in a
	// handler; a Publish beyond it fails with ErrEmbeddedFull (the copies
	// back from the tiers and the nacked deliveries are never refused:
	// MaxPendingRetries bounds the first, the second were counted
	// already). Default EmbeddedMaxQueuedDefault.
	MaxQueued int
	// MaxInFlight is how many deliveries one subscription hands out before
	// the first is acked or nacked (a prefetch). Default
	// EmbeddedMaxInFlightDefault.
	MaxInFlight int
	// DrainTimeout bounds a closing subscription's wait for its deliveries
	// in flight to be acked or nacked; what is still in a handler then is
	// reported by Close. Keep it above the handlers' ShutdownGrace. Default
	// EmbeddedDrainTimeoutDefault.
	DrainTimeout time.Duration
}

func (c EmbeddedConfig) withDefaults() EmbeddedConfig {
	c.PoisonTopic = cmp.Or(c.PoisonTopic, c.Topic+".poison")
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	c.MaxQueued = cmp.Or(c.MaxQueued, EmbeddedMaxQueuedDefault)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, EmbeddedMaxInFlightDefault)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, EmbeddedDrainTimeoutDefault)
	return c
}

func (c EmbeddedConfig) validate() error {
	switch {
	case c.Topic == "":
		return errors.New("router: EmbeddedConfig.Topic is required")
	case c.MaxQueued < 0:
		return fmt.Errorf("router: EmbeddedConfig.MaxQueued must be positive, got %d", c.MaxQueued)
	case c.MaxInFlight < 0:
		return fmt.Errorf("router: EmbeddedConfig.MaxInFlight must be positive, got %d", c.MaxInFlight)
	case c.DrainTimeout < 0:
		return fmt.Errorf("router: EmbeddedConfig.DrainTimeout must be positive, got %s", c.DrainTimeout)
	case c.PoisonTopic == c.Topic:
		return errors.New("router: EmbeddedConfig.PoisonTopic must differ from Topic")
	}
	return nil
}

// Embedded is the embedded default: an in-process broker of Sluice's own
// (EmbeddedPubSub: bounded queues, every delivery tracked until acked),
// in-process retry tiers (retrytiers.DelayedPublisher — bounded, not
// durable) and an in-memory poison topic that can be read back (Poisoned).
// For development, examples and tests; RabbitMQ is the durable counterpart.
//
// Nothing it holds is dropped silently. A message published with no
// handler running waits in its topic; a copy whose delay ends after the
// router closed waits there too. Close the router first: its Close drains
// the handler's subscription (no handler runs after it returns, unless the
// drain timed out), and Embedded.Close then reports every delivery not
// acked in an *UnfinishedError, with the copies still waiting in a tier.
type Embedded struct {
	cfg     EmbeddedConfig
	PubSub  *EmbeddedPubSub
	delayed *retrytiers.DelayedPublisher
	tiers   []retrytiers.Tier

	mu       sync.Mutex
	poisoned []*message.Message
}

// NewEmbedded starts the in-process broker and tiers.
func NewEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil { // the default poison topic too, against Topic
		return nil, err
	}
	tiers, err := retrytiers.Ladder(cfg.Topic, cfg.TierDelays...)
	if err != nil {
		return nil, err
	}
	e := &Embedded{cfg: cfg, PubSub: newEmbeddedPubSub(cfg), tiers: tiers}
	e.PubSub.sinks[cfg.PoisonTopic] = e.storePoisoned
	e.delayed, err = retrytiers.NewDelayedPublisher(retrytiers.DelayedPublisherConfig{
		Target: embeddedPublisher{e.PubSub, true}, Routes: retrytiers.Routes(cfg.Topic, tiers), Logger: cfg.Logger,
		MaxPending: cfg.MaxPendingRetries,
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Tiers returns the in-process retry tiers.
func (e *Embedded) Tiers() []retrytiers.Tier { return append([]retrytiers.Tier(nil), e.tiers...) }

// PendingRetries returns how many copies wait in the in-process tiers.
func (e *Embedded) PendingRetries() int { return e.delayed.Pending() }

// Poisoned returns the messages isolated in the poison topic so far.
func (e *Embedded) Poisoned() []*message.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*message.Message(nil), e.poisoned...)
}

// storePoisoned is the poison topic: a publish to it returns once the
// copies are stored here, as Endpoints.PoisonPublisher promises.
func (e *Embedded) storePoisoned(msgs ...*message.Message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range msgs {
		e.poisoned = append(e.poisoned, m.Copy())
	}
}

var _ Broker = (*Embedded)(nil)

// Endpoints are the embedded topic's: a subscriber of PubSub whose Close
// drains the handler's subscriptions, PubSub as poison publisher (stored
// before Publish returns), the in-process tiers as retry publisher, System
// "gochannel" (the label it had on Watermill's GoChannel, kept so that
// dashboards and alerts on messaging.system keep matching) and one
// consumer at most.
func (e *Embedded) Endpoints() Endpoints {
	return Endpoints{
		System: "gochannel", Topic: e.cfg.Topic, Subscriber: e.PubSub.subscriber(),
		Tiers: e.Tiers(), RetryPublisher: e.delayed,
		PoisonTopic: e.cfg.PoisonTopic, PoisonPublisher: e.PubSub,
		Consumers: 1, MaxConsumers: 1,
	}
}

// Close stops the tiers (dropping the copies still waiting, and saying how
// many), then the broker, draining what is still subscribed; close the
// router first. Its error joins the tiers' count with an *UnfinishedError
// (errors.As) naming every delivery not acked — queued, nacked back, or
// still in a handler. Idempotent.
func (e *Embedded) Close() error {
	return errors.Join(e.delayed.Close(), e.PubSub.Close())
}
