package router

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/sluicemq/sluice/retrytiers"
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
}

// Embedded is the embedded default: Watermill's GoChannel as the broker,
// in-process retry tiers (retrytiers.DelayedPublisher — not durable) and an
// in-memory poison topic that can be read back (Poisoned). For development,
// examples and tests; RabbitMQ is the durable counterpart.
type Embedded struct {
	cfg     EmbeddedConfig
	PubSub  *gochannel.GoChannel
	delayed *retrytiers.DelayedPublisher
	tiers   []retrytiers.Tier

	mu       sync.Mutex
	poisoned []*message.Message
	cancel   context.CancelFunc
	done     chan struct{}
}

// NewEmbedded starts the GoChannel, the in-process tiers and the reader of
// the poison topic.
func NewEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Topic == "" {
		return nil, errors.New("router: EmbeddedConfig.Topic is required")
	}
	cfg.PoisonTopic = cmp.Or(cfg.PoisonTopic, cfg.Topic+".poison")
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	tiers, err := retrytiers.Ladder(cfg.Topic, cfg.TierDelays...)
	if err != nil {
		return nil, err
	}
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, cfg.Logger)
	delayed, err := retrytiers.NewDelayedPublisher(retrytiers.DelayedPublisherConfig{
		Target: ps, Routes: retrytiers.Routes(cfg.Topic, tiers), Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	out, err := ps.Subscribe(ctx, cfg.PoisonTopic)
	if err != nil {
		cancel()
		return nil, err
	}
	e := &Embedded{cfg: cfg, PubSub: ps, delayed: delayed, tiers: tiers, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		for m := range out {
			e.mu.Lock()
			e.poisoned = append(e.poisoned, m)
			e.mu.Unlock()
			m.Ack()
		}
	}()
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

// Add adds a reliable handler consuming the topic: Topic and Subscriber are
// the GoChannel's; the Poison and Retry stages, when chosen, get the poison
// topic, the in-process tiers and the publishers where theirs are unset;
// Trace gets System "gochannel". Consumers must be 1: GoChannel gives every
// subscriber every message.
func (e *Embedded) Add(r *message.Router, cfg HandlerConfig) ([]*message.Handler, error) {
	if cfg.Consumers > 1 {
		return nil, errors.New("router: HandlerConfig.Consumers must be 1 on the embedded default (GoChannel fans out to every subscriber)")
	}
	cfg.Topic, cfg.Subscriber = e.cfg.Topic, e.PubSub
	cfg.Stages = cfg.Stages.withBroker(broker{
		copies: e.PubSub, retryCopies: e.delayed, poisonTopic: e.cfg.PoisonTopic,
		queue: e.cfg.Topic, tiers: e.tiers, system: "gochannel",
	})
	return Add(r, cfg)
}

// Close stops the tiers (dropping the copies still waiting, and saying how
// many), the poison reader and the GoChannel; close the router first.
func (e *Embedded) Close() error {
	err := e.delayed.Close()
	e.cancel()
	<-e.done
	return errors.Join(err, e.PubSub.Close())
}
