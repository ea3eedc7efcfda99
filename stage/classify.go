package stage

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice/internal/diag"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// ClassifyConfig configures the Classify middleware.
type ClassifyConfig struct {
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). Classify reads Classifier, which decides each
	// error's class (default sluice.DefaultClassifier(); give the
	// deduplication stage the same value, so that "commit on Rejected" and
	// "ack on Rejected" always agree — router.Stages.Env does); MeterProvider,
	// which receives the rejected counter (default the global OpenTelemetry
	// provider); Logger, one info line per rejection, what the stack around
	// Classify lacks (once per handler), and the failures nothing isolates
	// (see Classify) (default watermill.NopLogger; router.Add gives the
	// router's: by hand, give your router's).
	sluice.Env
}

// withDefaults returns a copy of c with its defaults filled.
func (c ClassifyConfig) withDefaults() ClassifyConfig {
	c.Classifier = cmp.Or(c.Classifier, sluice.DefaultClassifier())
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	return c
}

// Classify returns a middleware that turns every handler error into a
// *sluice.Failure with a class, so the stages outside it (retrytiers, poison) can act
// on the class. A sluice.ClassRejected failure becomes nil: the message is acked and
// the messages the handler produced are published; it is counted in
// sluice.rejected. A Transient failure of a handler whose shutdown grace ran
// out (ShutdownGrace cancelled its context with ErrShutdownGraceExpired) is
// not the message's: it becomes an unclassified error matching
// sluice.ErrShutdown, which the retry and poison stages pass through, so the
// delivery is nacked back to its queue with no attempt spent.
//
// Classify also says what it can tell of the stack around it, on Logger.
// At the first delivery of each handler it logs, once, the stages missing
// outside it — no poison stage (a Poison or Invariant failure is nacked and
// redelivered at once: a hot loop), no retry tiers — read from the marks
// the poison and retry stages leave on a delivery's context; and, for a
// handler reading watermill-amqp's subscriber, a delivery that Sluice's
// rabbitmq.Marshaler did not read (watermill-amqp's DefaultMarshaler nacks
// a delivery with any non-string header in a loop before the stages run).
// A Poison, Invariant or Exhausted failure that no poison stage outside
// isolates is logged with that explanation at most once a
// minute per handler, counting the failures in between. The
// middleware is safe for concurrent use.
func Classify(cfg ClassifyConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	c, logger := cfg.Classifier, cfg.Logger
	rejected, err := telemetry.Meter(cfg.MeterProvider).Int64Counter(telemetry.MetricRejected,
		metric.WithDescription("Deliveries acked as expected business rejections."))
	if err != nil {
		return nil, fmt.Errorf("middleware: creating %s counter: %w", telemetry.MetricRejected, err)
	}
	asm := &assembly{logger: logger, handlers: map[string]*handlerSeen{}}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			seen := asm.seen(msg)
			produced, err := h(msg)
			if err == nil {
				return produced, nil
			}
			class := c.Classify(err)
			defer asm.unisolated(msg, seen, class, err)
			if class == sluice.ClassTransient && errors.Is(context.Cause(msg.Context()), ErrShutdownGraceExpired) {
				// The shutdown grace ran out mid-handler: not the message's
				// failure. It goes back unprocessed, spending no attempt.
				return produced, fmt.Errorf("%w: %w", sluice.ErrShutdown, err)
			}
			if class == sluice.ClassRejected {
				rejected.Add(msg.Context(), 1, telemetry.DeliveryAttr(msg))
				logger.Info("Delivery rejected: committed and acked", diag.LogFields(telemetry.LogFields(msg, watermill.LogFields{
					"class": sluice.ClassRejected.String(), "reason": diag.Summary(err, 1024)})))
				sluice.Record(msg.Context(), func(r *sluice.Report) { r.Outcome, r.Class = sluice.OutcomeRejected, sluice.ClassRejected })
				return produced, nil
			}
			if f, ok := err.(*sluice.Failure); ok && f.Class == class { //nolint:errorlint // only a top-level sluice.Failure can be returned as is
				return produced, err
			}
			return produced, &sluice.Failure{Class: class, Err: err}
		}
	}, nil
}
