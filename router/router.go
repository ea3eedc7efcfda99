package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/unitofwork"
)

// HandlerConfig is one reliable handler.
type HandlerConfig struct {
	// Name of the Watermill handler; with Consumers > 1, "<Name>-<i>".
	// Required.
	Name string
	// Broker gives the handler its queue, subscriber, retry tiers, poison
	// queue and the publishers of the copies (rabbitmq.NewBroker, or the
	// embedded default, embedded.New). With a Broker, Topic and Subscriber
	// are the broker's, and the Poison and Retry stages get its endpoints
	// where theirs are unset.
	Broker broker.Broker
	// Topic to subscribe to. Required without a Broker.
	Topic string
	// Subscriber. Required without a Broker.
	Subscriber message.Subscriber
	// Handler for a handler that publishes nothing. Exactly one of Handler
	// and PublishingHandler is required.
	Handler message.NoPublishHandlerFunc
	// PublishingHandler returns messages to publish to PublishTopic: with
	// Outbox, written into the inbox's transaction and relayed after its
	// commit (the transactional outbox: nothing produced is lost, nothing
	// is produced by a delivery that rolled back); with Publisher, published
	// by Watermill after the stages returned nil. Beside Stages.Inbox that
	// is after the inbox committed: a publish that fails then is nacked,
	// the redelivery is a duplicate the inbox skips, and the messages are
	// lost — Add refuses it (ErrUnsafeStages) unless PublishAtMostOnce says
	// so. Without an inbox the redelivery runs the handler again, which
	// produces them again.
	PublishingHandler message.HandlerFunc
	// BatchHandler handles the deliveries in flight in batches: one claim
	// statement, one call, one commit per batch, each event's outcome its
	// own (deduplication.NewBatchHandler). It takes the place of the Inbox
	// and Recoverer stages and of Handler: give it instead of Handler and
	// PublishingHandler, with Stages.Inbox (its store, key and consumer).
	// What an event produces it writes through the outbox's Writer on that
	// event's context (msgs[i].Context()). Add refuses it with Stages.Order
	// (errUnsupported). Built once, shared by the handler's Consumers.
	BatchHandler *deduplication.BatchHandler
	PublishTopic string
	Publisher    message.Publisher
	// PublishAtMostOnce accepts Publisher beside Stages.Inbox, knowing
	// what it loses: PublishingHandler's messages are published after the
	// inbox's commit, at most once — a publish that fails then (a broker
	// blip, an unroutable topic) loses them without a failure recorded
	// anywhere (the redelivery is counted a duplicate). Default false: Add
	// refuses that assembly and names Outbox, which loses nothing.
	PublishAtMostOnce bool
	// Outbox writes PublishingHandler's messages in the inbox's unit of
	// work (sluicesql.Outbox; outbox.Handler); an outbox.Relay
	// publishes them. It needs Stages.Inbox, on the same database, and
	// replaces Publisher. A Handler writes what it produces with the
	// Writer's Publish itself.
	Outbox outbox.Writer
	// Consumers is how many copies of the handler consume Topic at once
	// (competing consumers). Default: the Broker's (1 on RabbitMQ, whose
	// Consumer keeps its prefetch in flight; 4 consumers with
	// BrokerConfig.WatermillSubscriber, which handles one delivery at a
	// time per consumer; 1, the most, on the embedded default), else 1.
	Consumers int
	// Stages around the handler.
	Stages Stages
}

// ErrUnsafeStages is matched by Add's error for an assembly that cannot
// give every delivery one recorded outcome, or loses what it produces:
// Retry without Poison (a spent budget, Exhausted, would reach the router,
// be nacked and come back at once, forever); an Inbox whose
// PublishingHandler's messages a Publisher sends after the commit (a
// publish that fails then loses them: the redelivery is a duplicate).
var ErrUnsafeStages = errors.New("router: unsafe stages")

// unsafe returns an error matching ErrUnsafeStages, naming what to add,
// when the chosen stages cannot keep the promise together.
func (s Stages) unsafe() error {
	if s.Retry != nil && s.Poison == nil {
		return fmt.Errorf("%w: Stages.Retry needs Stages.Poison: a delivery whose retry budget is spent (Exhausted) would otherwise be nacked back to the head of its queue, forever", ErrUnsafeStages)
	}
	return nil
}

// unsafe returns an error matching ErrUnsafeStages, naming the outbox,
// when what the handler produces could be lost after the inbox's commit.
func (c HandlerConfig) unsafe() error {
	if err := c.Stages.unsafe(); err != nil {
		return err
	}
	if c.PublishingHandler != nil && c.Publisher != nil && c.Stages.Inbox != nil && !c.PublishAtMostOnce {
		return fmt.Errorf("%w: HandlerConfig.Publisher beside Stages.Inbox publishes PublishingHandler's messages after the inbox's commit: "+
			"a publish that fails then is nacked, the redelivery is a duplicate the inbox skips, and the messages are lost. "+
			"Give HandlerConfig.Outbox instead (sluicesql.Outbox, relayed by an outbox.Relay), "+
			"or set HandlerConfig.PublishAtMostOnce to accept losing them", ErrUnsafeStages)
	}
	return nil
}

// errUnsupported is matched by Add's error for stages a handler of its
// kind cannot keep: a BatchHandler with Stages.Order.
var errUnsupported = errors.New("router: unsupported assembly")

// newBatchHandler builds the batch handler with the inbox of s, given the
// stages' shared settings, and leaves the Inbox and Recoverer stages out of
// s: the batch handler is both.
func newBatchHandler(s *Stages, bh deduplication.BatchHandler) (message.HandlerFunc, error) {
	in := *s.Inbox
	if s.Classifier == nil {
		s.Classifier = sluice.DefaultClassifier()
	}
	in.Env = inherit.Env(in.Env, s.Env)
	h, err := deduplication.NewBatchHandler(in, bh)
	if err != nil {
		return nil, fmt.Errorf("router: batch handler: %w", err)
	}
	s.Inbox, s.Recoverer = nil, nil
	return h, nil
}

// errDuplicateHandler is matched by Add's error for a handler name already on
// the router, or a topic another handler of the router consumes.
var errDuplicateHandler = errors.New("router: duplicate handler")

// Add adds the handler with its stages to r: one call for a reliable
// handler on an existing router. The handlers it added are returned.
//
// It refuses a name already on r (Watermill would panic), a topic that
// another handler added by Add consumes on r (two handlers on one queue
// silently split its messages), and an assembly that cannot keep the
// promise (ErrUnsafeStages: Retry without Poison; a Publisher beside the
// Inbox without PublishAtMostOnce). It names the consumer of the Inbox and Poison
// stages after the handler where they leave it unset, and exports the
// counters of its stages that the shipped alerts read at zero for it,
// before its first delivery (ExportCountersAtZero). It wraps the handler with
// unitofwork.Reentry, so an in-process retry middleware added to the
// router later — and so run inside the inbox — cannot run the handler twice
// in one inbox transaction.
func Add(r *message.Router, cfg HandlerConfig) ([]*message.Handler, error) {
	if p, ok := cfg.Broker.(broker.Partitioned); ok && len(p.Partitions()) > 0 {
		return addPartitions(r, cfg, p)
	}
	var system string // messaging.system of the handler's metrics
	prefetch := 0     // each consumer's deliveries in flight, where the broker says
	if cfg.Stages.Trace != nil {
		system = cfg.Stages.Trace.System
	}
	if cfg.Broker != nil {
		e := cfg.Broker.Endpoints()
		cfg.Topic, cfg.Subscriber = e.Topic, e.Subscriber
		if cfg.Consumers == 0 {
			cfg.Consumers = e.Consumers
		}
		if e.MaxConsumers > 0 && cfg.Consumers > e.MaxConsumers {
			return nil, fmt.Errorf("router: HandlerConfig.Consumers is %d; the %s broker allows at most %d", cfg.Consumers, e.System, e.MaxConsumers)
		}
		cfg.Stages = cfg.Stages.withEndpoints(e)
		if err := useMeterProvider(cfg.Broker, cfg.Stages.MeterProvider); err != nil {
			return nil, err
		}
		system = cmp.Or(system, e.System)
		prefetch = e.Prefetch
	}
	switch {
	case r == nil:
		return nil, errors.New("router: Add needs a router")
	case cfg.Name == "":
		return nil, errors.New("router: HandlerConfig.Name is required")
	case cfg.Topic == "":
		return nil, errors.New("router: HandlerConfig.Topic is required")
	case cfg.Subscriber == nil:
		return nil, errors.New("router: HandlerConfig.Subscriber is required")
	case cfg.BatchHandler != nil && (cfg.Handler != nil || cfg.PublishingHandler != nil):
		return nil, errors.New("router: HandlerConfig.BatchHandler takes the place of Handler and PublishingHandler: give one of the three")
	case cfg.BatchHandler != nil && cfg.Stages.Inbox == nil:
		return nil, errors.New("router: HandlerConfig.BatchHandler needs Stages.Inbox: a batch's claims and effects commit in the inbox's transaction")
	case cfg.BatchHandler != nil && cfg.Stages.Order != nil:
		return nil, fmt.Errorf("%w: HandlerConfig.BatchHandler with Stages.Order: a batch handler does not keep a key's events in order "+
			"(an event that fails leaves its batch while the key's later events commit); use a Handler for an ordered queue", errUnsupported)
	case cfg.BatchHandler != nil && (cfg.Outbox != nil || cfg.Publisher != nil):
		return nil, errors.New("router: HandlerConfig.BatchHandler writes what each event produces with the outbox's Publish on that event's context (msgs[i].Context()); leave Outbox and Publisher unset")
	case cfg.BatchHandler == nil && (cfg.Handler == nil) == (cfg.PublishingHandler == nil):
		return nil, errors.New("router: exactly one of HandlerConfig.Handler, HandlerConfig.PublishingHandler and HandlerConfig.BatchHandler is required")
	case cfg.Outbox != nil && cfg.PublishingHandler == nil:
		return nil, errors.New("router: HandlerConfig.Outbox takes a PublishingHandler's messages; a Handler writes what it produces with the outbox's Publish itself")
	case cfg.Outbox != nil && cfg.Publisher != nil:
		return nil, errors.New("router: HandlerConfig.Outbox and Publisher: give one (the outbox's relay publishes)")
	case cfg.Outbox != nil && cfg.Stages.Inbox == nil:
		return nil, errors.New("router: HandlerConfig.Outbox needs Stages.Inbox: the messages are written in the inbox's transaction")
	case cfg.PublishingHandler != nil && cfg.PublishTopic == "":
		return nil, errors.New("router: HandlerConfig.PublishingHandler needs PublishTopic")
	case cfg.PublishingHandler != nil && cfg.Publisher == nil && cfg.Outbox == nil:
		return nil, errors.New("router: HandlerConfig.PublishingHandler needs Outbox (or Publisher)")
	case cfg.PublishAtMostOnce && (cfg.Publisher == nil || cfg.PublishingHandler == nil):
		return nil, errors.New("router: HandlerConfig.PublishAtMostOnce is about a PublishingHandler's messages sent on Publisher: give both, or leave it false")
	case cfg.Consumers < 0:
		return nil, fmt.Errorf("router: HandlerConfig.Consumers must be positive, got %d", cfg.Consumers)
	case cfg.Stages.Order != nil && cfg.Consumers > 1:
		return nil, fmt.Errorf("router: Stages.Order needs one consumer per queue (HandlerConfig.Consumers is %d): competing consumers would run one key's messages at once; a queue's in-flight deliveries of different keys run concurrently anyway", cfg.Consumers)
	case cfg.Stages.Order != nil && cfg.Publisher != nil:
		return nil, errors.New("router: Stages.Order with HandlerConfig.Publisher: the messages a released delivery produces would not be published; give HandlerConfig.Outbox")
	case cfg.Stages.Order != nil && cfg.Stages.Inbox == nil:
		return nil, errors.New("router: Stages.Order needs Stages.Inbox: the held messages and the inbox's records share its database, and a released message must run once")
	}
	if err := cfg.unsafe(); err != nil {
		return nil, err
	}
	if cfg.Outbox != nil {
		if err := cfg.Outbox.CheckInbox(cfg.Stages.Inbox.Store); err != nil {
			return nil, fmt.Errorf("router: HandlerConfig.Outbox: %w", err)
		}
	}
	n := max(cfg.Consumers, 1)
	names := make([]string, n)
	for i := range n {
		names[i] = cfg.Name
		if n > 1 {
			names[i] += "-" + strconv.Itoa(i)
		}
		if _, taken := r.Handlers()[names[i]]; taken {
			return nil, fmt.Errorf("router: a handler named %q is already on this router: %w", names[i], errDuplicateHandler)
		}
	}
	if err := claimTopic(r, cfg.Topic, cfg.Name); err != nil {
		return nil, err
	}
	if cfg.Stages.Logger == nil {
		cfg.Stages.Logger = r.Logger()
	}
	subscriber := cfg.Subscriber
	if cfg.Stages.Brake != nil {
		gated, pausing := subscriber.(broker.GatedSubscriber)
		b, err := cfg.Stages.newBrake(cfg.Name, pausing)
		if err != nil {
			return nil, err
		}
		cfg.Stages.brake = b
		if pausing {
			subscriber = gated.WithGate(b)
		}
		subscriber = closingSubscriber{subscriber, b}
	}
	if cfg.Stages.Inbox != nil && cfg.Stages.Inbox.Consumer == "" { // before the ordering stage, which asks the inbox
		in := *cfg.Stages.Inbox
		in.Consumer = cfg.Name
		cfg.Stages.Inbox = &in
	}
	if cfg.Stages.Order != nil {
		o, err := cfg.Stages.newOrderer(cfg.Name)
		if err != nil {
			return nil, err
		}
		cfg.Stages.orderer = o
		subscriber = &orderedSubscriber{Subscriber: o.Serialize(subscriber), o: o, d: &telemetry.Delivery{Handler: cfg.Name, System: system}}
	}
	var out []*message.Handler
	if cfg.Stages.Poison != nil && cfg.Stages.Poison.Consumer == "" {
		p := *cfg.Stages.Poison
		p.Consumer = cfg.Name
		cfg.Stages.Poison = &p
	}
	if err := ExportCountersAtZero(cfg.Name, cfg.Topic, system, cfg.Stages); err != nil {
		return nil, fmt.Errorf("router: exporting the handler's counters at zero: %w", err)
	}
	var batched message.HandlerFunc
	stages := cfg.Stages
	if cfg.BatchHandler != nil {
		bh := *cfg.BatchHandler
		if bh.InFlight == 0 {
			bh.InFlight = prefetch * n // 0 where the broker does not say
		}
		var err error
		if batched, err = newBatchHandler(&stages, bh); err != nil {
			return nil, err
		}
	}
	for i := range n {
		mws, err := Middlewares(stages)
		if err != nil {
			return nil, err
		}
		name := names[i]
		var h *message.Handler
		switch {
		case batched != nil:
			h = r.AddConsumerHandler(name, cfg.Topic, subscriber, func(msg *message.Message) error {
				_, err := batched(msg)
				return err
			})
		case cfg.Handler != nil:
			h = r.AddConsumerHandler(name, cfg.Topic, subscriber, unitofwork.ReentryNoPublish(cfg.Handler))
		case cfg.Outbox != nil:
			h = r.AddConsumerHandler(name, cfg.Topic, subscriber, unitofwork.ReentryNoPublish(outbox.Handler(cfg.Outbox, cfg.PublishTopic, cfg.PublishingHandler)))
		default:
			h = r.AddHandler(name, cfg.Topic, subscriber, cfg.PublishTopic, cfg.Publisher, unitofwork.Reentry(cfg.PublishingHandler))
		}
		h.AddMiddleware(append([]message.HandlerMiddleware{nameHandler(cfg.Name, system)}, mws...)...)
		out = append(out, h)
	}
	if cfg.Stages.brake != nil {
		recordBrake(r, cfg.Name, cfg.Stages.brake)
	}
	return out, nil
}

// addPartitions adds a handler per partition of a partitioned broker
// (broker.Partitioned: rabbitmq.TopologyConfig.Partitions), named
// "<Name>-p<i>", each consuming its partition queue with the partition's
// tiers. The inbox's consumer stays the handler's Name (an event is a
// duplicate whichever partition it came through), the ordering stage's is
// the partition's (a key lives in one partition, and each partition's
// stage resumes only its own keys).
func addPartitions(r *message.Router, cfg HandlerConfig, p broker.Partitioned) ([]*message.Handler, error) {
	if cfg.Name == "" {
		return nil, errors.New("router: HandlerConfig.Name is required")
	}
	if err := useMeterProvider(cfg.Broker, cfg.Stages.MeterProvider); err != nil { // the depth gauges are the partitioned broker's
		return nil, err
	}
	var out []*message.Handler
	for i, part := range p.Partitions() {
		c := cfg
		c.Broker = part
		c.Name = cfg.Name + "-p" + strconv.Itoa(i)
		if in := cfg.Stages.Inbox; in != nil && in.Consumer == "" {
			inbox := *in
			inbox.Consumer = cfg.Name
			c.Stages.Inbox = &inbox
		}
		if pc := cfg.Stages.Poison; pc != nil && pc.Consumer == "" {
			poisonCfg := *pc
			poisonCfg.Consumer = cfg.Name
			c.Stages.Poison = &poisonCfg
		}
		hs, err := Add(r, c)
		if err != nil {
			return nil, fmt.Errorf("router: partition %d of %s: %w", i, cfg.Name, err)
		}
		out = append(out, hs...)
	}
	return out, nil
}

// useMeterProvider hands mp, when set, to a broker with instruments of
// its own (broker.MeteredBroker).
func useMeterProvider(b broker.Broker, mp metric.MeterProvider) error {
	if m, ok := b.(broker.MeteredBroker); ok && mp != nil {
		if err := m.UseMeterProvider(mp); err != nil {
			return fmt.Errorf("router: the broker's metrics: %w", err)
		}
	}
	return nil
}

// closingSubscriber closes the handler's brake (its cool-down and probes)
// after the subscriber: the router closes its subscribers when it closes.
type closingSubscriber struct {
	message.Subscriber
	also interface{ Close() error }
}

func (s closingSubscriber) Close() error {
	return errors.Join(s.Subscriber.Close(), s.also.Close())
}

// orderedSubscriber runs the handler's ordering stage beside its first
// subscription (resuming unfinished releases) and stops it when the
// subscriber closes.
type orderedSubscriber struct {
	message.Subscriber
	o    *ordering.Orderer
	d    *telemetry.Delivery
	once sync.Once
	wg   sync.WaitGroup
}

func (s *orderedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	if err == nil {
		s.once.Do(func() {
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.o.Run(s.d.With(ctx)) }()
		})
	}
	return ch, err
}

func (s *orderedSubscriber) Close() error {
	err := errors.Join(s.Subscriber.Close(), s.o.Close())
	s.wg.Wait()
	return err
}

// nameHandler puts the handler's name and messaging system on each
// delivery, so that metrics and logs name the handler given to Add, not its
// competing consumer's instance, and every stage's metrics the system.
func nameHandler(name, system string) message.HandlerMiddleware {
	d := &telemetry.Delivery{Handler: name, System: system}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			msg.SetContext(d.With(ctx))
			defer msg.SetContext(ctx)
			return h(msg)
		}
	}
}
