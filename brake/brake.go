package brake

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Defaults of Config, stated on its fields.
const (
	windowDefault       = 50
	failureRatioDefault = 0.5
	coolDownDefault     = 5 * time.Second
	maxCoolDownDefault  = time.Minute
	probeTimeoutDefault = 5 * time.Second
)

// State is the brake's state.
type State uint8

// The states.
const (
	Released State = iota // consuming
	Engaged               // not consuming; deliveries held
	Probing               // one probe delivery let through
)

func (s State) String() string {
	switch s {
	case Released:
		return "released"
	case Engaged:
		return "engaged"
	case Probing:
		return "probing"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Config configures New.
type Config struct {
	// Name labels the logs, metrics and spans: the handler's name. router.Add
	// sets it.
	Name string
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). The brake reads Classifier, which decides
	// which failures are Transient (default sluice.DefaultClassifier());
	// Logger, one line per change of state (default watermill.NopLogger;
	// router.Add gives the router's); MeterProvider and TracerProvider
	// (default the global providers); Clock, which times the cool-downs
	// (default sluice.SystemClock(); the test kit, package sluicetest, gives
	// its virtual clock).
	sluice.Env
	// Match narrows the Transient failures that count, e.g.
	// MatchUnreachable, or a rule of your own on the error's SQLSTATE
	// (sluicesql.SQLState). Default: every Transient failure. Failures of
	// any other class never count.
	Match func(error) bool
	// Window is how many of the latest outcomes are weighed. Default 50.
	Window int
	// FailureRatio is the share of the Window that counted failures must
	// reach to engage the brake, in (0, 1]. Default 0.5:
	// 25 of the last 50.
	FailureRatio float64
	// CoolDown is how long the brake stays engaged before a probe; it
	// doubles after each failed probe, up to MaxCoolDown, and starts again
	// from CoolDown once released. Defaults 5 s and 1 min (at
	// least CoolDown).
	CoolDown, MaxCoolDown time.Duration
	// Probe, when set, tests the dependency without touching a message
	// (db.PingContext, say): at the end of each cool-down the brake calls it
	// while consuming stays stopped. An error keeps the brake engaged for
	// another, doubled cool-down — no delivery is taken, so however long the
	// outage lasts no retry attempt is spent and no return counts toward a
	// quorum queue's x-delivery-limit. Nil lets one delivery probe, as
	// without a Probe: a dependency that answers a ping but fails the
	// handler is still caught, at the cost of that one delivery. Without a
	// Probe every probe is a delivery; a failed one fails with
	// sluice.ErrSetAside, which the retry stage sets aside in its first tier
	// (its attempt unchanged) instead of returning it to the queue
	// (docs/retry-tiers.md says what an outage costs). router.Add defaults it to
	// the inbox store's Ping when the store has one. Default: none.
	Probe func(ctx context.Context) error
	// ProbeTimeout bounds each call of Probe; a probe that outlasts it
	// failed. Default 5 s.
	ProbeTimeout time.Duration
	// Pausing says the subscriber stops consuming while the brake is engaged
	// (it reads Engaged; rabbitmq.Consumer does, and router.Add sets this
	// when the broker's subscriber can): held deliveries are then nacked
	// back at once. Without it they wait in the stage until the probe.
	Pausing bool
}

// Brake is the stage's state, shared by every consumer of one handler and
// read by its subscriber. Safe for concurrent use. Close stops its probes;
// router.Add closes it with the handler's subscriber.
type Brake struct {
	cfg       Config
	threshold int
	counts    func(error) bool
	attrs     metric.MeasurementOption

	mu       sync.Mutex
	state    State
	changed  chan struct{} // closed at each change of state
	probing  bool          // the probe delivery is in flight
	coolDown time.Duration
	ring     []bool // the latest outcomes: true for a counted failure
	next     int
	seen     int
	failures int

	// The cool-down and the dependency probe (probe.go).
	timer        sluice.Timer    // the cool-down running, if any
	probeCtx     context.Context // cancelled by Close
	cancelProbes context.CancelFunc
	running      sync.WaitGroup // a Probe call in progress
	failedProbes int            // dependency probes failed since engaging
	// wary: the brake has engaged, and no whole window has passed since
	// without a counted failure: such failures are held, not spent.
	wary bool

	stateGauge                   metric.Int64Gauge
	transitions, heldCt, probeCt metric.Int64Counter
	tracer                       trace.Tracer
}

// withDefaults returns a copy of c with its defaults filled: MaxCoolDown
// defaults to at least CoolDown.
func (c Config) withDefaults() Config {
	c.Window = cmp.Or(c.Window, windowDefault)
	c.FailureRatio = cmp.Or(c.FailureRatio, failureRatioDefault)
	c.CoolDown = cmp.Or(c.CoolDown, coolDownDefault)
	c.MaxCoolDown = cmp.Or(c.MaxCoolDown, max(maxCoolDownDefault, c.CoolDown))
	c.ProbeTimeout = cmp.Or(c.ProbeTimeout, probeTimeoutDefault)
	c.Classifier = cmp.Or(c.Classifier, sluice.DefaultClassifier())
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	c.TracerProvider = cmp.Or(c.TracerProvider, otel.GetTracerProvider())
	c.Clock = cmp.Or(c.Clock, sluice.SystemClock())
	return c
}

// validate checks a Config with its defaults filled.
func (c Config) validate() error {
	switch {
	case c.Window < 1:
		return fmt.Errorf("brake: Config.Window must be positive, got %d", c.Window)
	case c.FailureRatio <= 0 || c.FailureRatio > 1 || math.IsNaN(c.FailureRatio):
		return fmt.Errorf("brake: Config.FailureRatio must be in (0, 1], got %v", c.FailureRatio)
	case c.CoolDown < 0:
		return fmt.Errorf("brake: Config.CoolDown must be positive, got %s", c.CoolDown)
	case c.MaxCoolDown < c.CoolDown:
		return fmt.Errorf("brake: Config.MaxCoolDown (%s) must be at least CoolDown (%s)", c.MaxCoolDown, c.CoolDown)
	case c.ProbeTimeout < 0:
		return fmt.Errorf("brake: Config.ProbeTimeout must be positive, got %s", c.ProbeTimeout)
	}
	return nil
}

// New validates cfg and returns a released Brake. Put its Middleware in
// the stack (router.Stages.Brake does both) and give it to the subscriber.
func New(cfg Config) (*Brake, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Brake{
		cfg:       cfg,
		threshold: max(1, int(math.Ceil(cfg.FailureRatio*float64(cfg.Window)-1e-9))),
		attrs:     metric.WithAttributes(telemetry.HandlerKey.String(cfg.Name)),
		changed:   make(chan struct{}),
		coolDown:  cfg.CoolDown,
		ring:      make([]bool, cfg.Window),
		tracer:    telemetry.Tracer(cfg.TracerProvider),
	}
	b.probeCtx, b.cancelProbes = context.WithCancel(context.Background())
	b.counts = func(err error) bool {
		return cfg.Classifier.Classify(err) == sluice.ClassTransient && (cfg.Match == nil || cfg.Match(err))
	}
	meter := telemetry.Meter(cfg.MeterProvider)
	var err error
	if b.stateGauge, err = meter.Int64Gauge(telemetry.MetricBrakeState, metric.WithDescription("The brake's state: 0 released, 1 engaged, 2 probing.")); err != nil {
		return nil, err
	}
	if b.transitions, err = meter.Int64Counter(telemetry.MetricBrakeTransitions, metric.WithDescription("Changes of the brake's state, by the state entered.")); err != nil {
		return nil, err
	}
	if b.heldCt, err = meter.Int64Counter(telemetry.MetricBrakeHeld, metric.WithDescription("Deliveries the brake gave back unprocessed.")); err != nil {
		return nil, err
	}
	if b.probeCt, err = meter.Int64Counter(telemetry.MetricBrakeProbes, metric.WithDescription("The brake's probes, by what probed and the result.")); err != nil {
		return nil, err
	}
	b.stateGauge.Record(context.Background(), int64(Released), b.attrs)
	return b, nil
}

// State returns the current state.
func (b *Brake) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Engaged reports whether consuming should stop now, and returns a channel
// closed at the next change of state. A subscriber that can stop consuming
// reads it (broker.Gate).
func (b *Brake) Engaged() (engaged bool, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == Engaged, b.changed
}

// Probing reports whether the brake lets one delivery through as a probe
// now. A subscriber that reads it (broker.ProbingGate; rabbitmq.Consumer
// does) takes one delivery at a time while it holds, so a failed probe
// returns one delivery, not a prefetch's worth.
func (b *Brake) Probing() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == Probing
}

// held returns the attributes of a held delivery: the delivery's
// (telemetry.DeliveryAttrs), the consumer group the brake's Name.
func (b *Brake) held(ctx context.Context) metric.MeasurementOption {
	return metric.WithAttributes(telemetry.DeliveryAttrs(ctx, telemetry.HandlerKey.String(b.cfg.Name))...)
}

// Middleware is the stage; one Brake may serve many consumers of a handler.
func (b *Brake) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		probe, err := b.admit(ctx)
		if err != nil {
			b.heldCt.Add(ctx, 1, b.held(ctx))
			return nil, err
		}
		produced, err := h(msg)
		if b.record(err, probe) {
			b.heldCt.Add(ctx, 1, b.held(ctx))
			b.cfg.Logger.Debug("Delivery held back by the brake", telemetry.LogFields(msg, watermill.LogFields{"probe": probe}))
			if probe { // set aside, not returned: a probe costs nothing however long the outage
				return nil, fmt.Errorf("%w: %w", sluice.ErrSetAside, err)
			}
			return nil, fmt.Errorf("%w: %w", sluice.ErrHeld, err)
		}
		return produced, err
	}
}

// errEngaged is what a delivery gets while the brake is engaged and the
// subscriber stops consuming: nacked back at once.
var errEngaged = fmt.Errorf("%w: the brake is engaged", sluice.ErrHeld)

// admit decides whether a delivery may run: yes when released; as the probe
// when probing and no probe is in flight; otherwise it is held — at once
// when the subscriber pauses, else after waiting for the next state.
func (b *Brake) admit(ctx context.Context) (probe bool, err error) {
	for {
		b.mu.Lock()
		switch {
		case b.state == Released:
			b.mu.Unlock()
			return false, nil
		case b.state == Probing && !b.probing:
			b.probing = true
			b.mu.Unlock()
			return true, nil
		case b.state == Engaged && b.cfg.Pausing:
			b.mu.Unlock()
			return false, errEngaged
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return false, fmt.Errorf("%w: waiting for the brake: %w", sluice.ErrHeld, context.Cause(ctx))
		}
	}
}

// record weighs a delivery's outcome and reports whether its failure is to
// be held back rather than passed to the retry stage.
func (b *Brake) record(err error, probe bool) (hold bool) {
	counted := err != nil && b.counts(err)
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
		switch {
		case counted:
			b.countProbe(probeDelivery, resultFailed)
			b.coolDown = min(2*b.coolDown, b.cfg.MaxCoolDown)
			b.transition(Engaged, err)
			return true
		case err == nil || b.cfg.Classifier.Classify(err) == sluice.ClassRejected:
			b.countProbe(probeDelivery, resultPassed)
			b.clear()
			b.coolDown = b.cfg.CoolDown
			b.transition(Released, nil)
		default: // says nothing about the dependency: the next delivery probes
			b.countProbe(probeDelivery, resultInconclusive)
			b.broadcast()
		}
		return false
	}
	if b.state != Released {
		return counted // in flight when the brake engaged
	}
	if b.seen == len(b.ring) {
		if b.ring[b.next] {
			b.failures--
		}
	} else {
		b.seen++
	}
	b.ring[b.next] = counted
	b.next = (b.next + 1) % len(b.ring)
	if !counted {
		if b.wary && b.seen == len(b.ring) && b.failures == 0 {
			b.wary = false // a whole window without one: the outage is over
		}
		return false
	}
	b.failures++
	if b.failures < b.threshold {
		// Once the brake has seen the dependency down, a failure of the
		// kind it watches is held, not spent, until a whole window passes
		// without one: a database that lets some connections in and
		// refuses others (53300, too many clients) would otherwise spend
		// a good event's ladder between engagements.
		return b.wary
	}
	b.transition(Engaged, err)
	return true
}

func (b *Brake) clear() {
	clear(b.ring)
	b.next, b.seen, b.failures = 0, 0, 0
}

func (b *Brake) broadcast() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// transition enters state to (b.mu held): wakes the waiters and the
// subscriber, arms the cool-down when engaging, and logs, counts and spans
// the change once.
func (b *Brake) transition(to State, cause error) {
	from := b.state
	b.state = to
	b.broadcast()
	ctx := context.Background()
	b.stateGauge.Record(ctx, int64(to), b.attrs)
	b.transitions.Add(ctx, 1, metric.WithAttributes(telemetry.HandlerKey.String(b.cfg.Name), telemetry.AttrBrakeState.String(to.String())))
	fields := watermill.LogFields{"handler": b.cfg.Name, "from": from.String(), "to": to.String()}
	_, span := b.tracer.Start(ctx, "sluice.brake "+to.String(), trace.WithAttributes(
		telemetry.HandlerKey.String(b.cfg.Name), telemetry.AttrBrakeState.String(to.String()), telemetry.AttrBrakeFrom.String(from.String())))
	defer span.End()
	switch to {
	case Engaged:
		b.wary = true
		fields["failures"] = fmt.Sprintf("%d of the last %d deliveries", b.failures, b.seen)
		fields["cool_down"] = b.coolDown.String()
		if from == Probing {
			fields["failures"] = "the probe failed"
		}
		b.failedProbes = 0
		b.startCoolDown()
		telemetry.RecordError(span, cause)
		span.SetStatus(codes.Error, "consuming stopped")
		b.cfg.Logger.Error("Brake engaged: consuming stops; deliveries go back to the queue unprocessed until a probe succeeds", diag.RedactError(cause), fields)
	case Probing:
		if b.cfg.Probe != nil {
			fields["probe"] = fmt.Sprintf("the dependency answered after %d failed probes", b.failedProbes)
		}
		b.cfg.Logger.Info("Brake probing: one delivery is let through", fields)
	case Released:
		b.cfg.Logger.Info("Brake released: consuming resumes", fields)
	}
}
