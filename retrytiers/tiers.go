package retrytiers

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/clock"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/envsigner"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/internal/republish"
	"github.com/sluicemq/sluice/internal/stack"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Defaults of Config, stated on its fields.
const (
	publishBackoffDefault = time.Second
	publishTimeoutDefault = 30 * time.Second
)

// errorMaxLength bounds the LastErrorKey summary, in bytes.
const errorMaxLength = 1024

// Config configures the retry-tier middleware.
type Config struct {
	// Publisher publishes the copies; it must return only once the copy is
	// stored (a confirmed publisher on RabbitMQ). Required.
	Publisher message.Publisher
	// Tiers in order; a delivery's attempt N goes to Tiers[N-1]. Required:
	// use broker.Ladder, or the broker's tiers (router.Add gives them).
	Tiers []broker.Tier
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). The stage reads Classifier, for errors that
	// carry no class — the stage used without middleware.Classify inside it
	// (default sluice.DefaultClassifier()); Signer, which signs every copy
	// for Queue and verifies, on the way in, the retry history a delivery
	// carries (the attempt, the failures, the tier, the origin:
	// sluice.IsRetryKey): believed only when it verifies for Queue — a copy
	// signed for another queue (forwarded by a handler there, or replayed onto
	// this one) is a first attempt here; give the poison and replay stages the
	// same one (router.Stages.Env does); without one the history is believed
	// only on a copy back from one of Tiers (sluice_amqp_last_death_queue,
	// reason expired), and on any other delivery it is removed — a producer's
	// sluice_attempt never skips the ladder; MeterProvider, which receives
	// the metrics (default the global provider); Logger, one line per copy
	// parked (info), per budget spent and per failed publish (error) (default
	// watermill.NopLogger; router.Add gives the router's); Clock, which
	// stamps a copy's sluice.FirstFailedAtKey when the delivery has none
	// (default sluice.SystemClock(); the test kit, package sluicetest, gives
	// its virtual clock); PublishTimeout, which bounds publishing one copy, on
	// a context detached from the handler's, so that a handler that timed out
	// (its message context expired) still reaches its tier (default 30 s);
	// PublishBackoff, waited before returning a failed publish, so that an
	// unreachable tier is not a hot redelivery loop (default 1 s).
	sluice.Env
	// Queue is the consumer's queue: the one the copies come back to, for
	// which they are signed and their history believed (Signer). Default:
	// the topic the Watermill handler subscribed to (on RabbitMQ, the
	// queue); router.Add gives the poison stage's Queue.
	Queue string
}

// withDefaults returns a copy of c with its defaults filled.
func (c Config) withDefaults() Config {
	c.Classifier = cmp.Or(c.Classifier, sluice.DefaultClassifier())
	c.PublishBackoff = cmp.Or(c.PublishBackoff, publishBackoffDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, publishTimeoutDefault)
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	c.Clock = cmp.Or(c.Clock, sluice.SystemClock())
	c.Signer, _ = envsigner.Of(c.Signer)
	return c
}

// validate checks a Config with its defaults filled.
func (c Config) validate() error {
	if c.Publisher == nil {
		return errors.New("retrytiers: Config.Publisher is required")
	}
	if len(c.Tiers) == 0 {
		return errors.New("retrytiers: Config.Tiers is required (see broker.Ladder)")
	}
	for i, t := range c.Tiers {
		if t.Name == "" || t.Topic == "" {
			return fmt.Errorf("retrytiers: Config.Tiers[%d] needs a Name and a Topic", i)
		}
	}
	switch {
	case c.PublishBackoff < 0:
		return fmt.Errorf("retrytiers: %s must not be negative, got %s", inherit.Field("PublishBackoff"), c.PublishBackoff)
	case c.PublishTimeout < 0:
		return fmt.Errorf("retrytiers: %s must not be negative, got %s", inherit.Field("PublishTimeout"), c.PublishTimeout)
	}
	return nil
}

// New returns the retry-tier middleware. On a Transient failure of attempt
// N with a tier left, it publishes a copy — same payload and metadata, its
// identity as message UUID and sluice.CopyIDKey (the same for every
// delivery of the message: a copy made twice is recognised), AttemptKey
// N+1, LastErrorKey, FirstFailedAtKey (kept from the first failure),
// RetryTierKey — to Tiers[N-1], waits until Publish returns,
// and returns nil, so the original is acked only once its copy is stored.
// A tier that refuses the copy for certain is replaced by another (see
// park); after an uncertain publish (sluice.ErrPublishUncertain: the copy
// may be stored) no other tier is tried. When the publish fails it waits
// PublishBackoff and returns the handler's error joined with the publish
// error (nack: nothing lost; the broker delivers it again) — unless the
// publisher cannot build the copy at all (sluice.ErrUnpublishable: a
// metadata value the broker cannot carry), which no retry mends: that is a
// Poison failure naming the key, for the poison stage. With no tier
// left it returns a ClassExhausted failure wrapping the error. Other classes
// and successes pass through untouched.
func New(cfg Config) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	retries, exhausted, err := telemetry.RetryCounters(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	s := &stage{cfg: cfg, retries: retries, exhausted: exhausted}
	for _, t := range cfg.Tiers {
		s.topics = append(s.topics, t.Topics()...)
	}
	return s.middleware, nil
}

type stage struct {
	cfg                Config
	topics             []string // the tiers' topics: where a copy Sluice wrote comes back from
	retries, exhausted metric.Int64Counter
}

func (s *stage) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		stack.Mark(msg, stack.Retry) // the classifier inside knows its Transient failures are parked
		if removed := s.cfg.Signer.Believe(msg, sluice.IsRetryKey, s.queue(msg), s.topics...); removed != nil {
			s.cfg.Logger.Info("Retry history not written by Sluice: not believed, the delivery is a first attempt",
				telemetry.LogFields(msg, watermill.LogFields{"removed": strings.Join(removed, ",")}))
		}
		produced, err := h(msg)
		if errors.Is(err, sluice.ErrSetAside) && len(s.cfg.Tiers) > 0 {
			return nil, s.setAside(msg, err)
		}
		if err == nil || s.cfg.Classifier.Classify(err) != sluice.ClassTransient {
			return produced, err
		}
		attempt, aErr := sluice.Attempt(msg)
		if aErr != nil {
			return nil, sluice.Poison(errors.Join(aErr, err))
		}
		ctx := msg.Context()
		reason := diag.Summary(err, errorMaxLength)
		if attempt > len(s.cfg.Tiers) {
			s.exhausted.Add(ctx, 1, telemetry.DeliveryAttr(msg, semconv.ErrorTypeKey.String(sluice.ClassExhausted.String())))
			s.cfg.Logger.Error("Retry budget spent: the delivery is exhausted", diag.RedactError(err), diag.LogFields(telemetry.LogFields(msg,
				watermill.LogFields{"class": sluice.ClassExhausted.String(), "attempt": attempt, "reason": reason})))
			return nil, sluice.NewFailure(sluice.ClassExhausted,
				fmt.Errorf("retry budget spent after %d attempts: %w", attempt, err))
		}
		plan := s.plan(attempt, err)
		tier, pErr := s.park(msg, plan, reason)
		if errors.Is(pErr, sluice.ErrUnpublishable) { // no tier can take it, now or later: never a nack loop
			s.cfg.Logger.Error("The retry copy cannot be built; the delivery is poison", diag.RedactError(pErr), diag.LogFields(telemetry.LogFields(msg,
				watermill.LogFields{"class": sluice.ClassPoison.String(), "tier": tier.Name, "attempt": attempt})))
			return nil, sluice.Poison(errors.Join(fmt.Errorf("retrytiers: the retry copy cannot be published: %w", pErr), err))
		}
		if pErr != nil {
			republish.Backoff(s.cfg.PublishBackoff)
			s.cfg.Logger.Error("Publishing the retry copy failed; the delivery is nacked after the backoff", diag.RedactError(pErr), diag.LogFields(telemetry.LogFields(msg,
				watermill.LogFields{"class": sluice.ClassTransient.String(), "tier": tier.Name, "attempt": attempt, "backoff": s.cfg.PublishBackoff.String(),
					"uncertain": errors.Is(pErr, sluice.ErrPublishUncertain)})))
			return nil, errors.Join(err, fmt.Errorf("retrytiers: publishing the retry copy to tier %s: %w", tier.Name, pErr))
		}
		fields := watermill.LogFields{"class": sluice.ClassTransient.String(), "tier": tier.Name, "wait": plan.wait.String(),
			"attempt": attempt, "next_attempt": plan.next, "reason": reason}
		if plan.asked {
			fields["retry_after"] = plan.after.String()
		}
		s.cfg.Logger.Info("Delivery parked in a retry tier", diag.LogFields(telemetry.LogFields(msg, fields)))
		s.retries.Add(ctx, 1, telemetry.DeliveryAttr(msg,
			telemetry.AttrTier.String(tier.Name), semconv.ErrorTypeKey.String(sluice.ClassTransient.String())))
		sluice.Record(ctx, func(r *sluice.Report) {
			r.Outcome, r.Class, r.Tier, r.Attempt = sluice.OutcomeRetried, sluice.ClassTransient, tier.Name, plan.next
		})
		return nil, nil
	}
}

// setAside publishes a copy of a held delivery (sluice.ErrSetAside: the
// brake's failed probe) to the first tier, its attempt unchanged, and
// returns nil once the copy is stored: the original is acked, not returned
// to its queue, where each return counts toward a quorum queue's
// x-delivery-limit. When no tier takes it, it returns err: nacked, as any
// held delivery.
func (s *stage) setAside(msg *message.Message, err error) error {
	attempt, aErr := sluice.Attempt(msg)
	if aErr != nil {
		return err // held: the next delivery finds the forged attempt
	}
	first := s.cfg.Tiers[0]
	p := plan{tier: 0, topic: first.Pick().Topic, next: attempt}
	tier, pErr := s.park(msg, p, diag.Summary(err, errorMaxLength))
	if pErr != nil {
		return errors.Join(err, fmt.Errorf("retrytiers: setting the held delivery aside in tier %s: %w", tier.Name, pErr))
	}
	s.cfg.Logger.Debug("Held delivery set aside in a retry tier, its attempt unchanged", diag.LogFields(telemetry.LogFields(msg,
		watermill.LogFields{"tier": tier.Name, "attempt": attempt})))
	sluice.Record(msg.Context(), func(r *sluice.Report) {
		r.Outcome, r.Tier, r.Attempt = sluice.OutcomeHeld, tier.Name, attempt
	})
	return nil
}

// park publishes the copy of the delivery to the tier plan chose. When
// that tier refuses it (deleted, full, unreachable) it tries the later
// tiers, then the earlier ones: a copy waiting longer or shorter than
// planned keeps the delivery's place free, where a nack after the backoff
// would bring it back at the head of the queue, ahead of every other
// message, to fail again. It returns the tier used, or the planned one and
// every error. A copy the publisher cannot build (sluice.ErrUnpublishable)
// is tried once. Only a certain refusal moves on: after an uncertain
// publish (sluice.ErrPublishUncertain: no confirm, a channel closed before
// it) the copy may be stored in that tier, so no other tier is tried.
func (s *stage) park(msg *message.Message, plan plan, reason string) (broker.Tier, error) {
	planned := plan.tier
	order := []int{planned}
	for i := planned + 1; i < len(s.cfg.Tiers); i++ {
		order = append(order, i)
	}
	for i := planned - 1; i >= 0; i-- {
		order = append(order, i)
	}
	c := s.copy(msg, plan.next, s.cfg.Tiers[planned], reason)
	var errs []error
	for _, i := range order {
		tier := s.cfg.Tiers[i]
		topic := plan.topic
		if i != planned {
			topic = tier.Pick().Topic
		}
		c.Metadata[sluice.RetryTierKey] = tier.Name
		s.cfg.Signer.Sign(c, s.queue(msg))
		err := republish.Try(s.cfg.Publisher, topic, c, s.cfg.PublishTimeout)
		if err == nil {
			if i != planned {
				s.cfg.Logger.Error("Retry tier refused the copy; it waits in another tier", diag.RedactError(errors.Join(errs...)), diag.LogFields(telemetry.LogFields(msg,
					watermill.LogFields{"tier": s.cfg.Tiers[planned].Name, "instead": tier.Name, "attempt": plan.next - 1})))
			}
			return tier, nil
		}
		errs = append(errs, fmt.Errorf("tier %s (%s): %w", tier.Name, topic, err))
		if errors.Is(err, sluice.ErrUnpublishable) { // every tier would refuse it alike
			break
		}
		if errors.Is(err, sluice.ErrPublishUncertain) {
			// The copy may be stored in this tier: one in another tier
			// would start a second retry chain. The delivery is nacked
			// after the backoff and comes back (at least once).
			break
		}
	}
	return s.cfg.Tiers[planned], errors.Join(errs...)
}

// queue is the consumer's queue msg's history belongs to: Config.Queue,
// else the topic the handler subscribed to.
func (s *stage) queue(msg *message.Message) string {
	return cmp.Or(s.cfg.Queue, message.SubscribeTopicFromCtx(msg.Context()))
}

// copy is the copy of msg that is attempt next.
func (s *stage) copy(msg *message.Message, next int, tier broker.Tier, reason string) *message.Message {
	c := republish.Copy(msg, 5)
	republish.Identify(c, msg, republish.KindRetry) // one identity, whichever tier takes it
	c.Metadata[sluice.AttemptKey] = strconv.Itoa(next)
	c.Metadata[sluice.LastErrorKey] = reason
	c.Metadata[sluice.RetryTierKey] = tier.Name
	if c.Metadata[sluice.FirstFailedAtKey] == "" {
		c.Metadata[sluice.FirstFailedAtKey] = clock.Stamp(s.cfg.Clock.Now())
	}
	return c
}
