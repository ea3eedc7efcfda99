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
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/clock"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/envsigner"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/internal/republish"
	"github.com/sluicemq/sluice/internal/stack"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Defaults of Config, stated on its fields.
const (
	publishBackoffDefault = time.Second
	publishTimeoutDefault = 30 * time.Second
)

// errorMaxLength bounds sluice_poison_reason, in bytes (a copy too large for
// the broker's frame is cut down to fit besides: sluice_poison_dropped).
const errorMaxLength = 1024

// Config configures the poison stage.
type Config struct {
	// Publisher publishes to the poison queue; it must return only once the
	// message is stored and routed (a confirmed, mandatory publisher on
	// RabbitMQ). Required.
	Publisher message.Publisher
	// Topic is the poison queue. Required.
	Topic string
	// Queue is the consumer's queue, recorded in sluice_poison_queue for
	// replays. Default: the topic the Watermill handler subscribed to (on
	// RabbitMQ, the queue), even when the message came through an exchange
	// with another routing key.
	Queue string
	// Consumer is recorded in sluice_poison_consumer. Default: the
	// Watermill handler's name.
	Consumer string
	// Classes are the failure classes isolated. Default ClassPoison,
	// ClassInvariant and ClassExhausted.
	// ClassTransient and ClassRejected are refused.
	Classes []sluice.Class
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). The stage reads Classifier, for errors that
	// carry no class (default sluice.DefaultClassifier()); Signer, which signs
	// every copy (poison queue, park topic) for the consumer's queue (Queue,
	// or the topic the handler subscribed to — never the delivery's routing
	// key: what sluice_poison_queue records, and where `sluice dlq replay`
	// sends it) and verifies, on the way in, the diagnosis a delivery carries
	// (sluice_poison_*, the parked mark among them): believed only when it
	// verifies for that queue — give the retry and replay stages the same one
	// (router.Stages.Env does); without one the diagnosis is believed only on
	// a copy back from ParkTopic (sluice_amqp_last_death_queue, reason
	// expired), and on any other delivery it is removed and the handler runs;
	// MeterProvider, which receives sluice.poisoned (default the global
	// provider); Logger, one line per message isolated (error level: the
	// class, the reason, a panic's whole stack) and per failed publish
	// (default watermill.NopLogger; router.Add gives the router's); Clock,
	// which stamps the copies: sluice_poisoned_at, and
	// sluice.FirstFailedAtKey when the delivery has none (default
	// sluice.SystemClock(); the test kit, package sluicetest, gives its
	// virtual clock); PublishTimeout, which bounds publishing one copy, on a
	// context detached from the handler's deadline (default 30 s);
	// PublishBackoff, waited before returning a failed publish, so that an
	// unreachable poison queue is not a hot redelivery loop (default 1 s).
	sluice.Env
	// ParkTopic is where a diagnosed copy waits when the poison queue
	// refuses it (full, deleted, unreachable): a delay queue that returns
	// its messages to the consumer's queue. router.Add gives the first
	// retry tier, and ParkPublisher its publisher (default Publisher). The
	// delivery is then acked at once, instead of keeping its place for
	// PublishBackoff and coming back at the head of the queue, ahead of
	// every other message, to be refused again; the copy comes back marked
	// sluice_poison_parked and goes to the poison queue without running the
	// handler.
	// Without ParkTopic, or when parking fails too, the delivery is nacked
	// after PublishBackoff. A publish whose outcome is uncertain
	// (sluice.ErrPublishUncertain: no confirm, the channel closed first)
	// is never parked — the copy may already be in the poison queue — and
	// its delivery is nacked after PublishBackoff.
	ParkTopic     string
	ParkPublisher message.Publisher
	// DisablePark keeps router.Add from giving a ParkTopic: a refused copy's
	// delivery is always nacked after PublishBackoff.
	DisablePark bool
}

// stackMaxLength bounds sluice_poison_stack, in bytes.
const stackMaxLength = 8 << 10

// withDefaults returns a copy of c with its defaults filled.
func (c Config) withDefaults() Config {
	if len(c.Classes) == 0 { // a slice, not comparable: no cmp.Or
		c.Classes = poisonqueue.ClassesDefault
	}
	c.Classifier = cmp.Or(c.Classifier, sluice.DefaultClassifier())
	c.PublishBackoff = cmp.Or(c.PublishBackoff, publishBackoffDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, publishTimeoutDefault)
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	c.ParkPublisher = cmp.Or(c.ParkPublisher, c.Publisher)
	c.Clock = cmp.Or(c.Clock, sluice.SystemClock())
	c.Signer, _ = envsigner.Of(c.Signer)
	return c
}

// validate checks a Config with its defaults filled.
func (c Config) validate() error {
	if c.Publisher == nil {
		return errors.New("poison: Config.Publisher is required")
	}
	if strings.TrimSpace(c.Topic) == "" {
		return errors.New("poison: Config.Topic is required")
	}
	for i, cl := range c.Classes {
		if !cl.Valid() || cl == sluice.ClassTransient || cl == sluice.ClassRejected {
			return fmt.Errorf("poison: Config.Classes[%d] is %s: want poison, invariant or exhausted", i, cl)
		}
	}
	switch {
	case c.ParkTopic == c.Topic:
		return fmt.Errorf("poison: Config.ParkTopic must not be the poison queue %q", c.Topic)
	case c.PublishBackoff < 0:
		return fmt.Errorf("poison: %s must not be negative, got %s", inherit.Field("PublishBackoff"), c.PublishBackoff)
	case c.PublishTimeout < 0:
		return fmt.Errorf("poison: %s must not be negative, got %s", inherit.Field("PublishTimeout"), c.PublishTimeout)
	}
	return nil
}

// New returns the poison stage. When the handler fails with one of Classes
// it publishes a copy — the original payload and metadata plus the diagnosis
// keys (sluice_poison_class, sluice_poison_reason, ...: poison.Diagnosis and
// docs/poison.md), its identity as message UUID and sluice.CopyIDKey (the
// same for every delivery of the message, parked or not: a copy made twice is
// one item) — to Topic, and returns nil only once Publish returned nil, so
// the original is acked only after the copy is stored. When the publish fails
// it waits PublishBackoff and returns the handler's error joined with the
// publish error: the original is nacked and nothing is lost. A copy the
// publisher cannot build (sluice.ErrUnpublishable) is never nacked: the stage
// leaves out the key the error names, or keeps only the diagnosis, and says
// so in sluice_poison_dropped; a copy too large for the broker (a header near
// the AMQP frame size) is cut down to fit, its own reason first (see fit).
// Other errors pass through untouched.
func New(cfg Config) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	poisoned, err := telemetry.PoisonedCounter(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	parkedCt, err := telemetry.Meter(cfg.MeterProvider).Int64Counter(telemetry.MetricPoisonParked,
		metric.WithDescription("Poison copies the poison queue refused, parked to be isolated later."))
	if err != nil {
		return nil, err
	}
	s := &stage{cfg: cfg, poisoned: poisoned, parkedCt: parkedCt}
	if cfg.ParkTopic != "" {
		s.parks = []string{cfg.ParkTopic}
	}
	return s.middleware, nil
}

type stage struct {
	cfg                Config
	parks              []string // where a parked copy comes back from
	poisoned, parkedCt metric.Int64Counter
}

func isDiagnosisKey(k string) bool { return strings.HasPrefix(k, metakeys.PoisonPrefix) }

func (s *stage) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		stack.Mark(msg, stack.Poison) // the classifier inside knows its failures are isolated
		if removed := s.cfg.Signer.Believe(msg, isDiagnosisKey, s.signedFor(msg), s.parks...); removed != nil {
			s.cfg.Logger.Info("Poison diagnosis not written by Sluice: not believed, the handler runs",
				telemetry.LogFields(msg, watermill.LogFields{"removed": strings.Join(removed, ",")}))
		}
		if class, ok := parked(msg); ok { // diagnosed before, the poison queue refused it
			c := republish.Copy(msg, 0)
			delete(c.Metadata, metakeys.PoisonParked)
			// The same diagnosed copy, moved on: it keeps its identity.
			c.UUID = msg.UUID
			c.Metadata[sluice.CopyIDKey] = msg.UUID
			// Where a replay sends it back is this consumer's queue,
			// whatever the copy says.
			c.Metadata[metakeys.PoisonQueue] = s.queue(msg)
			c.Metadata[metakeys.PoisonConsumer] = cmp.Or(s.cfg.Consumer, telemetry.Handler(msg.Context()))
			return s.isolate(msg, c, class, errors.New(msg.Metadata.Get(metakeys.PoisonReason)))
		}
		produced, err := h(msg)
		if err == nil {
			return produced, nil
		}
		class := s.cfg.Classifier.Classify(err)
		if !slices.Contains(s.cfg.Classes, class) {
			return produced, err
		}
		return s.isolate(msg, s.diagnose(msg, class, err), class, err)
	}
}

// parked reports whether msg is a diagnosed copy back from the park topic,
// and its class.
func parked(msg *message.Message) (sluice.Class, bool) {
	if msg.Metadata.Get(metakeys.PoisonParked) == "" {
		return sluice.Unclassified, false
	}
	class, err := sluice.ParseClass(msg.Metadata.Get(metakeys.PoisonClass))
	return class, err == nil && class != sluice.ClassTransient && class != sluice.ClassRejected
}

// isolate publishes the diagnosed copy to the poison queue, or parks it, or
// nacks the delivery after the backoff.
func (s *stage) isolate(msg, diagnosed *message.Message, class sluice.Class, err error) ([]*message.Message, error) {
	ctx := msg.Context()
	queue := s.signedFor(msg)
	pErr := s.try(s.cfg.Publisher, s.cfg.Topic, diagnosed, queue)
	for left := leaveOutMax; errors.Is(pErr, sluice.ErrUnpublishable) && left > 0; left-- {
		// The publisher cannot build the copy (a metadata value the
		// broker cannot carry): a nack would bring the delivery back to
		// fail alike. Leave out what it names, or keep only the diagnosis.
		var ok bool
		if diagnosed, ok = s.leaveOut(diagnosed, pErr); !ok {
			break
		}
		s.cfg.Logger.Error("The poison copy cannot be published as it is; it leaves out metadata", diag.RedactError(pErr),
			diag.LogFields(telemetry.LogFields(msg, watermill.LogFields{"class": class.String(), "dropped": diagnosed.Metadata.Get(metakeys.PoisonDropped)})))
		pErr = s.try(s.cfg.Publisher, s.cfg.Topic, diagnosed, queue)
	}
	// After an uncertain publish the copy may be in the poison queue: a
	// parked one would be a second entry. Only a certain refusal parks.
	if pErr != nil && s.cfg.ParkTopic != "" && !s.cfg.DisablePark && !errors.Is(pErr, sluice.ErrPublishUncertain) {
		diagnosed.Metadata[metakeys.PoisonParked] = diag.Summary(pErr, 256)
		parkErr := s.try(s.cfg.ParkPublisher, s.cfg.ParkTopic, diagnosed, queue)
		if parkErr == nil {
			s.cfg.Logger.Error("The poison queue refused the copy; it waits in the park topic and is isolated when it comes back", diag.RedactError(pErr),
				diag.LogFields(telemetry.LogFields(msg, watermill.LogFields{"class": class.String(), "poison_queue": s.cfg.Topic, "park_topic": s.cfg.ParkTopic})))
			s.parkedCt.Add(ctx, 1, telemetry.DeliveryAttr(msg, semconv.ErrorTypeKey.String(class.String())))
			sluice.Record(ctx, func(r *sluice.Report) { r.Outcome, r.Class = sluice.OutcomeParked, class })
			return nil, nil
		}
		pErr = errors.Join(pErr, fmt.Errorf("parking the copy in %s: %w", s.cfg.ParkTopic, parkErr))
	}
	if pErr != nil {
		republish.Backoff(s.cfg.PublishBackoff)
		s.cfg.Logger.Error("Publishing to the poison queue failed; the delivery is nacked after the backoff", diag.RedactError(pErr),
			diag.LogFields(telemetry.LogFields(msg, watermill.LogFields{"class": class.String(), "poison_queue": s.cfg.Topic, "backoff": s.cfg.PublishBackoff.String()})))
		return nil, errors.Join(err, fmt.Errorf("poison: cannot publish to the poison queue %s: %w", s.cfg.Topic, pErr))
	}
	fields := watermill.LogFields{"class": class.String(), "reason": diagnosed.Metadata.Get(metakeys.PoisonReason),
		"attempt": diagnosed.Metadata.Get(sluice.AttemptKey), "poison_queue": s.cfg.Topic}
	if p, ok := errors.AsType[*sluice.PanicError](err); ok {
		fields["stack"] = string(p.Stack)
	}
	s.cfg.Logger.Error("Delivery isolated in the poison queue", diag.RedactError(err), diag.LogFields(telemetry.LogFields(msg, fields)))
	s.poisoned.Add(ctx, 1, metric.WithAttributes(telemetry.DeliveryAttrs(ctx, semconv.ErrorTypeKey.String(class.String()))...))
	sluice.Record(ctx, func(r *sluice.Report) {
		r.Outcome, r.Class, r.Reason = sluice.OutcomePoisoned, class, diagnosed.Metadata.Get(metakeys.PoisonReason)
	})
	return nil, nil
}

// try signs c as it now is, for queue, and publishes it to topic, bounded
// by PublishTimeout.
func (s *stage) try(p message.Publisher, topic string, c *message.Message, queue string) error {
	s.cfg.Signer.Sign(c, queue)
	return republish.Try(p, topic, c, s.cfg.PublishTimeout)
}

// diagnose returns the copy published to the poison queue.
func (s *stage) diagnose(msg *message.Message, class sluice.Class, err error) *message.Message {
	c := republish.Copy(msg, 11)
	republish.Identify(c, msg, republish.KindPoison) // the same for every delivery of the message
	md := msg.Metadata
	now := clock.Stamp(s.cfg.Clock.Now())
	queue := s.queue(msg)
	exchange, routingKey, _ := metakeys.Origin(md)
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
	c.Metadata[metakeys.PoisonClass] = class.String()
	c.Metadata[metakeys.PoisonReason] = diag.Summary(err, errorMaxLength)
	if p, ok := errors.AsType[*sluice.PanicError](err); ok {
		c.Metadata[metakeys.PoisonStack] = diag.Bound(string(p.Stack), stackMaxLength)
	}
	c.Metadata[metakeys.PoisonConsumer] = cmp.Or(s.cfg.Consumer, telemetry.Handler(msg.Context()))
	c.Metadata[metakeys.PoisonQueue] = queue
	c.Metadata[metakeys.PoisonExchange] = exchange
	c.Metadata[metakeys.PoisonRoutingKey] = routingKey
	c.Metadata[metakeys.PoisonedAt] = now
	if sc := telemetry.ParseTraceparent(md.Get(sluice.TraceparentKey)); sc.IsValid() {
		c.Metadata[metakeys.PoisonTraceID] = sc.TraceID().String()
	}
	return c
}

// leaveOutMax bounds the keys the poison stage leaves out one by one before
// it keeps only the diagnosis.
const leaveOutMax = 8

// leaveOut returns c without what pErr says the publisher cannot carry: cut
// down to fit when it is too large (fit), else the key it names, else (or
// when that is not in c) every key but the diagnosis, the event's and the
// failure history. sluice_poison_dropped lists what was left out ("*" for
// the rest).
// ok is false when there is nothing left to leave out.
func (s *stage) leaveOut(c *message.Message, pErr error) (*message.Message, bool) {
	if o, ok := errors.AsType[oversize](pErr); ok { // too large: cut it down to fit
		return c, s.fit(c, o.Excess())
	}
	dropped := c.Metadata.Get(metakeys.PoisonDropped)
	if dropped == "*" {
		return c, false
	}
	if ue, ok := errors.AsType[*sluice.UnpublishableError](pErr); ok && ue.Key != "" && ue.Key != metakeys.PoisonDropped {
		if _, present := c.Metadata[ue.Key]; present {
			delete(c.Metadata, ue.Key)
			c.Metadata[metakeys.PoisonDropped] = s.addDropped(dropped, ue.Key)
			return c, true
		}
	}
	for k := range c.Metadata {
		if !kept(k) {
			delete(c.Metadata, k)
		}
	}
	c.Metadata[metakeys.PoisonDropped] = "*"
	return c, true
}

// kept reports whether k stays on a copy cut down to its diagnosis.
func kept(k string) bool {
	switch k {
	case sluice.EventIDKey, sluice.EventTypeKey, sluice.AttemptKey, sluice.FirstFailedAtKey, sluice.TraceparentKey:
		return true
	}
	return strings.HasPrefix(k, metakeys.PoisonPrefix) || strings.HasPrefix(k, metakeys.OriginPrefix)
}

// signedFor is the queue msg's control headers are signed for and
// verified on: Config.Queue, else the topic the handler subscribed to. Not
// the routing key queue falls back to: a producer chooses that.
func (s *stage) signedFor(msg *message.Message) string {
	return cmp.Or(s.cfg.Queue, message.SubscribeTopicFromCtx(msg.Context()))
}

// queue is where a replay of msg goes: Config.Queue, else the queue the
// handler consumes.
func (s *stage) queue(msg *message.Message) string {
	return cmp.Or(s.cfg.Queue, message.SubscribeTopicFromCtx(msg.Context()), msg.Metadata.Get(metakeys.SourceRoutingKey))
}
