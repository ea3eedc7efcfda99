package poison

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/clock"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/republish"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Defaults.
const (
	PublishBackoffDefault = time.Second
	PublishTimeoutDefault = 30 * time.Second
	ErrorMaxLengthDefault = 1024
)

// MetricPoisoned counts messages isolated in the poison queue, by class.
const MetricPoisoned = "sluice.poisoned"

// ClassesDefault are the classes isolated when Config.Classes is empty.
var ClassesDefault = []sluice.Class{sluice.ClassPoison, sluice.ClassInvariant, sluice.ClassExhausted}

// Config configures the poison stage.
type Config struct {
	// Publisher publishes to the poison queue; it must return only once the
	// message is stored and routed (a confirmed, mandatory publisher on
	// RabbitMQ). Required.
	Publisher message.Publisher
	// Topic is the poison queue. Required.
	Topic string
	// Queue is the consumer's queue, recorded in QueueKey for replays.
	// Default: the topic the Watermill handler subscribed to (on RabbitMQ,
	// the queue), even when the message came through an exchange with
	// another routing key.
	Queue string
	// Consumer is recorded in ConsumerKey. Default: the Watermill handler's name.
	Consumer string
	// Classes are the failure classes isolated. Default ClassesDefault.
	// ClassTransient and ClassRejected are refused.
	Classes []sluice.Class
	// Classifier classifies errors that carry no class. Default
	// sluice.DefaultClassifier().
	Classifier *sluice.Classifier
	// ErrorMaxLength bounds ReasonKey, in bytes. Default ErrorMaxLengthDefault.
	ErrorMaxLength int
	// PublishBackoff is waited before returning a failed publish, so an
	// unreachable poison queue is not a hot redelivery loop. Default
	// PublishBackoffDefault.
	PublishBackoff time.Duration
	// PublishTimeout bounds publishing one copy, on a context detached from
	// the handler's deadline. Default PublishTimeoutDefault.
	PublishTimeout time.Duration
	// MeterProvider receives MetricPoisoned. Default the global provider.
	MeterProvider metric.MeterProvider
	// Logger receives one line per message isolated (error level: the
	// class, the reason, a panic's whole stack) and per failed publish.
	// Default watermill.NopLogger; router.Add gives the router's.
	Logger watermill.LoggerAdapter
}

// StackMaxLength bounds StackKey, in bytes.
const StackMaxLength = 8 << 10

// New returns the poison stage. When the handler fails with one of Classes
// it publishes a copy — the original payload and metadata plus the diagnosis
// keys (ClassKey, ReasonKey, ...) — to Topic, and returns nil only once
// Publish returned nil, so the original is acked only after the copy is
// stored. When the publish fails it waits PublishBackoff and returns the
// handler's error joined with the publish error: the original is nacked and
// nothing is lost. Other errors pass through untouched.
func New(cfg Config) (message.HandlerMiddleware, error) {
	if cfg.Publisher == nil {
		return nil, errors.New("poison: Config.Publisher is required")
	}
	if strings.TrimSpace(cfg.Topic) == "" {
		return nil, errors.New("poison: Config.Topic is required")
	}
	if len(cfg.Classes) == 0 {
		cfg.Classes = ClassesDefault
	}
	for i, c := range cfg.Classes {
		if !c.Valid() || c == sluice.ClassTransient || c == sluice.ClassRejected {
			return nil, fmt.Errorf("poison: Config.Classes[%d] is %s: want poison, invariant or exhausted", i, c)
		}
	}
	if cfg.Classifier == nil {
		cfg.Classifier = sluice.DefaultClassifier()
	}
	if cfg.ErrorMaxLength == 0 {
		cfg.ErrorMaxLength = ErrorMaxLengthDefault
	}
	if cfg.PublishBackoff == 0 {
		cfg.PublishBackoff = PublishBackoffDefault
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = PublishTimeoutDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	switch {
	case cfg.ErrorMaxLength < 16:
		return nil, fmt.Errorf("poison: Config.ErrorMaxLength must be at least 16, got %d", cfg.ErrorMaxLength)
	case cfg.PublishBackoff < 0:
		return nil, fmt.Errorf("poison: Config.PublishBackoff must not be negative, got %s", cfg.PublishBackoff)
	case cfg.PublishTimeout < 0:
		return nil, fmt.Errorf("poison: Config.PublishTimeout must not be negative, got %s", cfg.PublishTimeout)
	}
	poisoned, err := telemetry.Meter(cfg.MeterProvider).Int64Counter(MetricPoisoned,
		metric.WithDescription("Messages isolated in the poison queue."))
	if err != nil {
		return nil, err
	}
	s := &stage{cfg: cfg, poisoned: poisoned}
	return s.middleware, nil
}

type stage struct {
	cfg      Config
	poisoned metric.Int64Counter
}

func (s *stage) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		produced, err := h(msg)
		if err == nil {
			return produced, nil
		}
		class := s.cfg.Classifier.Classify(err)
		if !slices.Contains(s.cfg.Classes, class) {
			return produced, err
		}
		ctx := msg.Context()
		diagnosed := s.diagnose(msg, class, err)
		if pErr := republish.Publish(s.cfg.Publisher, s.cfg.Topic, diagnosed, s.cfg.PublishTimeout, s.cfg.PublishBackoff); pErr != nil {
			s.cfg.Logger.Error("Publishing to the poison queue failed; the delivery is nacked after the backoff", diag.RedactError(pErr),
				telemetry.LogFields(msg, watermill.LogFields{"class": class.String(), "poison_queue": s.cfg.Topic, "backoff": s.cfg.PublishBackoff.String()}))
			return nil, errors.Join(err, fmt.Errorf("poison: cannot publish to the poison queue %s: %w", s.cfg.Topic, pErr))
		}
		fields := watermill.LogFields{"class": class.String(), "reason": diagnosed.Metadata.Get(ReasonKey),
			"attempt": diagnosed.Metadata.Get(sluice.AttemptKey), "poison_queue": s.cfg.Topic}
		if p, ok := errors.AsType[*sluice.PanicError](err); ok {
			fields["stack"] = string(p.Stack)
		}
		s.cfg.Logger.Error("Delivery isolated in the poison queue", diag.RedactError(err), telemetry.LogFields(msg, fields))
		s.poisoned.Add(ctx, 1, metric.WithAttributes(
			telemetry.HandlerKey.String(telemetry.Handler(ctx)), attribute.String("sluice.class", class.String())))
		sluice.Record(ctx, func(r *sluice.Report) {
			r.Outcome, r.Class, r.Reason = sluice.OutcomePoisoned, class, diagnosed.Metadata.Get(ReasonKey)
		})
		return nil, nil
	}
}

// diagnose returns the copy published to the poison queue.
func (s *stage) diagnose(msg *message.Message, class sluice.Class, err error) *message.Message {
	c := republish.Copy(msg, 10)
	md := msg.Metadata
	now := clock.Now()
	queue := cmp.Or(s.cfg.Queue, message.SubscribeTopicFromCtx(msg.Context()), md.Get(sluice.SourceRoutingKeyKey))
	exchange, routingKey, _ := sluice.Origin(md)
	// One key per fact: the attempts made and the first failure are the
	// shared keys, checked (a forged attempt is not copied) and completed.
	if attempt, aErr := sluice.Attempt(msg); aErr == nil {
		c.Metadata[sluice.AttemptKey] = strconv.Itoa(attempt)
	} else {
		delete(c.Metadata, sluice.AttemptKey) // the reason names the bad value
	}
	if c.Metadata[sluice.FirstFailedAtKey] == "" {
		c.Metadata[sluice.FirstFailedAtKey] = now
	}
	c.Metadata[ClassKey] = class.String()
	c.Metadata[ReasonKey] = diag.Summary(err, s.cfg.ErrorMaxLength)
	if p, ok := errors.AsType[*sluice.PanicError](err); ok {
		c.Metadata[StackKey] = diag.Bound(string(p.Stack), StackMaxLength)
	}
	c.Metadata[ConsumerKey] = cmp.Or(s.cfg.Consumer, telemetry.Handler(msg.Context()))
	c.Metadata[QueueKey] = queue
	c.Metadata[ExchangeKey] = exchange
	c.Metadata[RoutingKeyKey] = routingKey
	c.Metadata[PoisonedAtKey] = now
	if sc := telemetry.ParseTraceparent(md.Get(sluice.TraceparentKey)); sc.IsValid() {
		c.Metadata[TraceIDKey] = sc.TraceID().String()
	}
	return c
}
