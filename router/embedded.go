package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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
	// MaxPendingRetries bounds the copies waiting in the in-process tiers
	// (retrytiers.DelayedPublisherConfig.MaxPending); beyond it the retry
	// stage nacks. Default retrytiers.MaxPendingDefault.
	MaxPendingRetries int
}

// Embedded is the embedded default: Watermill's GoChannel as the broker,
// in-process retry tiers (retrytiers.DelayedPublisher — bounded, not
// durable) and an in-memory poison topic that can be read back (Poisoned).
// For development, examples and tests; RabbitMQ is the durable counterpart.
//
// A copy whose delay ends while no handler consumes the topic (after the
// router closed) is not published into the GoChannel, which would drop it
// silently: it counts as dropped, and Close reports it.
type Embedded struct {
	cfg     EmbeddedConfig
	PubSub  *gochannel.GoChannel
	delayed *retrytiers.DelayedPublisher
	tiers   []retrytiers.Tier

	mu          sync.Mutex
	poisoned    []*message.Message
	subscribers int // live subscriptions to Topic
	cancel      context.CancelFunc
	done        chan struct{}
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
	e := &Embedded{cfg: cfg, PubSub: ps, tiers: tiers, done: make(chan struct{})}
	delayed, err := retrytiers.NewDelayedPublisher(retrytiers.DelayedPublisherConfig{
		Target: consumedTopic{e}, Routes: retrytiers.Routes(cfg.Topic, tiers), Logger: cfg.Logger,
		MaxPending: cfg.MaxPendingRetries,
	})
	if err != nil {
		return nil, err
	}
	e.delayed = delayed
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	out, err := ps.Subscribe(ctx, cfg.PoisonTopic)
	if err != nil {
		cancel()
		return nil, err
	}
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

var _ Broker = (*Embedded)(nil)

// Endpoints are the embedded topic's: the GoChannel as subscriber and poison
// publisher, the in-process tiers as retry publisher, System "gochannel",
// and one consumer at most — GoChannel gives every subscriber every
// message.
func (e *Embedded) Endpoints() Endpoints {
	return Endpoints{
		System: "gochannel", Topic: e.cfg.Topic, Subscriber: countingSubscriber{e},
		Tiers: e.Tiers(), RetryPublisher: e.delayed,
		PoisonTopic: e.cfg.PoisonTopic, PoisonPublisher: e.PubSub,
		Consumers: 1, MaxConsumers: 1,
	}
}

// Close stops the tiers (dropping the copies still waiting, and saying how
// many), the poison reader and the GoChannel; close the router first.
func (e *Embedded) Close() error {
	err := e.delayed.Close()
	e.cancel()
	<-e.done
	return errors.Join(err, e.PubSub.Close())
}

// ErrNoConsumer is matched by a retry copy whose delay ended while no
// handler consumed the embedded topic.
var ErrNoConsumer = errors.New("router: no handler consumes the embedded topic (the router closed)")

// countingSubscriber is the GoChannel as the handlers' subscriber, counting
// the live subscriptions to the topic.
type countingSubscriber struct{ e *Embedded }

func (s countingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out, err := s.e.PubSub.Subscribe(ctx, topic)
	if err != nil || topic != s.e.cfg.Topic {
		return out, err
	}
	s.e.mu.Lock()
	s.e.subscribers++
	s.e.mu.Unlock()
	go func() { // ends with the subscription: the router cancels ctx at Close
		<-ctx.Done()
		s.e.mu.Lock()
		s.e.subscribers--
		s.e.mu.Unlock()
	}()
	return out, nil
}

func (s countingSubscriber) Close() error { return nil } // Embedded.Close closes the GoChannel

// consumedTopic publishes the tiers' copies into the GoChannel only while a
// handler consumes the topic.
type consumedTopic struct{ e *Embedded }

func (t consumedTopic) Publish(topic string, msgs ...*message.Message) error {
	t.e.mu.Lock()
	live := t.e.subscribers > 0
	t.e.mu.Unlock()
	if !live {
		return fmt.Errorf("%w: %d retry copies for %q", ErrNoConsumer, len(msgs), topic)
	}
	return t.e.PubSub.Publish(topic, msgs...)
}

func (consumedTopic) Close() error { return nil }
