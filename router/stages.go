package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/retrytiers"
)

// Stages selects the stages around a handler; a nil field leaves its stage
// out. Whatever is chosen runs in the one order:
//
//	ShutdownGrace → Trace → Replay → Poison → Retry → Brake → Classify → Inbox → Recoverer → handler
type Stages struct {
	// ShutdownGrace lets a handler in flight finish its commit for this long
	// after the router begins to close (middleware.ShutdownGrace). Default
	// middleware.ShutdownGraceDefault; negative leaves the stage out.
	ShutdownGrace time.Duration
	Trace         *middleware.TraceConfig
	// Replay records what became of a message replayed from a poison
	// queue (package replay), for sluice dlq replay and report.
	Replay *replay.Config
	Poison *poison.Config
	Retry  *retrytiers.Config
	// Brake stops consuming while Transient failures (of the kind its Match
	// accepts) dominate, holding deliveries back unprocessed instead of
	// spending their retry tiers (package brake). Add builds one brake per
	// handler, shared by its consumers, and gives it to a subscriber that
	// can stop consuming (GatedSubscriber), and closes it when that
	// subscriber closes. Its Probe defaults to the inbox store's Ping when
	// the store is a Pinger. Middlewares alone builds a brake per call that
	// waits instead (Pausing false unless set) and that nothing closes; for
	// a subscriber of your own, build it with brake.New, wire both and
	// Close it.
	Brake     *brake.Config
	Classify  *middleware.ClassifyConfig
	Inbox     *deduplication.Config
	Recoverer *middleware.RecovererConfig
	// Signer is given to the Replay, Poison and Retry stages whose own
	// Signer is nil: the key that proves Sluice wrote a delivery's control
	// headers (the attempt, the poison diagnosis, the replay run), which
	// `sluice dlq replay --signing-key-file` signs with too. Default none:
	// the stages believe the retry history and the parked mark only on a
	// copy back from the queue's own tier, and the replay run of any
	// delivery (docs/architecture.md, "Trust boundary").
	Signer *sluice.Signer
	// Classifier is given to every stage that classifies (Poison, Retry,
	// Classify, Inbox) whose own Classifier is nil, so "commit on Rejected"
	// and "ack on Rejected" always agree. Default sluice.DefaultClassifier().
	Classifier *sluice.Classifier
	// MeterProvider is given to every stage whose own is nil. Default the
	// global OpenTelemetry provider.
	MeterProvider metric.MeterProvider
	// TracerProvider is given to the Trace stage when its own is nil.
	// Default the global OpenTelemetry provider.
	TracerProvider trace.TracerProvider
	// Logger is given to every stage that logs a delivery's fate (Poison,
	// Retry, Classify, Inbox) whose own Logger is nil. Default: Add gives
	// the router's logger; Middlewares alone, none.
	Logger watermill.LoggerAdapter

	// brake is the handler's brake, built once by Add.
	brake *brake.Brake
}

// Middlewares builds the chosen stages, outermost first, for
// message.Handler.AddMiddleware (or message.Router.AddMiddleware). A
// configuration error names the stage and the field.
func Middlewares(s Stages) ([]message.HandlerMiddleware, error) {
	c := s.Classifier
	if c == nil {
		c = sluice.DefaultClassifier()
	}
	var mws []message.HandlerMiddleware
	add := func(stage string, mw message.HandlerMiddleware, err error) error {
		if err != nil {
			return fmt.Errorf("router: %s stage: %w", stage, err)
		}
		mws = append(mws, mw)
		return nil
	}
	var errs []error
	if s.ShutdownGrace >= 0 {
		mw, err := middleware.ShutdownGrace(middleware.ShutdownGraceConfig{Grace: s.ShutdownGrace})
		errs = append(errs, add("shutdown grace", mw, err))
	}
	if s.Trace != nil {
		cfg := *s.Trace
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		cfg.TracerProvider = cmp.Or(cfg.TracerProvider, s.TracerProvider)
		mw, err := middleware.Trace(cfg)
		errs = append(errs, add("trace", mw, err))
	}
	if s.Replay != nil {
		cfg := *s.Replay
		cfg.Logger = cmp.Or(cfg.Logger, s.Logger)
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		cfg.Signer = cmp.Or(cfg.Signer, s.Signer)
		mw, err := replay.New(cfg)
		errs = append(errs, add("replay", mw, err))
	}
	if s.Poison != nil {
		cfg := *s.Poison
		cfg.Classifier = cmp.Or(cfg.Classifier, c)
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		cfg.Logger = cmp.Or(cfg.Logger, s.Logger)
		cfg.Signer = cmp.Or(cfg.Signer, s.Signer)
		mw, err := poison.New(cfg)
		errs = append(errs, add("poison", mw, err))
	}
	if s.Retry != nil {
		cfg := *s.Retry
		cfg.Classifier = cmp.Or(cfg.Classifier, c)
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		cfg.Logger = cmp.Or(cfg.Logger, s.Logger)
		cfg.Signer = cmp.Or(cfg.Signer, s.Signer)
		mw, err := retrytiers.New(cfg)
		errs = append(errs, add("retry", mw, err))
	}
	if s.brake == nil && s.Brake != nil {
		b, err := s.newBrake("", false)
		if err != nil {
			return nil, err
		}
		s.brake = b
	}
	if s.brake != nil {
		mws = append(mws, s.brake.Middleware)
	}
	if s.Classify != nil {
		cfg := *s.Classify
		cfg.Classifier = cmp.Or(cfg.Classifier, c)
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		cfg.Logger = cmp.Or(cfg.Logger, s.Logger)
		mw, err := middleware.Classify(cfg)
		errs = append(errs, add("classify", mw, err))
	}
	if s.Inbox != nil {
		cfg := *s.Inbox
		cfg.Classifier = cmp.Or(cfg.Classifier, c)
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		cfg.Logger = cmp.Or(cfg.Logger, s.Logger)
		mw, err := deduplication.New(cfg)
		errs = append(errs, add("inbox", mw, err))
		if s.Replay != nil && s.Replay.Tx != nil { // "processed" in the inbox's transaction
			mw, err := replay.InTx(*s.Replay)
			errs = append(errs, add("replay (in the inbox's transaction)", mw, err))
		}
	}
	if s.Recoverer != nil {
		mw, err := middleware.Recoverer(*s.Recoverer)
		errs = append(errs, add("recoverer", mw, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return mws, nil
}

// Pinger is a dependency that can say whether it answers without being
// given a message. An inbox Store that is one (a Ping(ctx) error method)
// becomes the brake's Probe when Stages.Brake has none.
type Pinger interface {
	Ping(ctx context.Context) error
}

// newBrake builds the brake of Stages.Brake for the handler named name; its
// Classifier defaults to Stages.Classifier, then to brake.New's default;
// its Probe to the inbox store's Ping.
func (s Stages) newBrake(name string, pausing bool) (*brake.Brake, error) {
	cfg := *s.Brake
	cfg.Name = cmp.Or(cfg.Name, name)
	if p, ok := s.inboxStore().(Pinger); ok && cfg.Probe == nil {
		cfg.Probe = p.Ping
	}
	cfg.Pausing = cfg.Pausing || pausing
	cfg.Classifier = cmp.Or(cfg.Classifier, s.Classifier)
	cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
	cfg.TracerProvider = cmp.Or(cfg.TracerProvider, s.TracerProvider)
	cfg.Logger = cmp.Or(cfg.Logger, s.Logger)
	b, err := brake.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("router: brake stage: %w", err)
	}
	return b, nil
}

func (s Stages) inboxStore() deduplication.Store {
	if s.Inbox == nil {
		return nil
	}
	return s.Inbox.Store
}
