package ordering

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Defaults.
const (
	// resumeIntervalDefault is Config.ResumeInterval's default.
	resumeIntervalDefault = 5 * time.Second
	// storeTimeoutDefault is Config.StoreTimeout's default.
	storeTimeoutDefault = 10 * time.Second
	// releaseMax is how many held messages one delivery releases before it
	// lets the next delivery (or Run) go on with the rest.
	releaseMax = 100
)

// Config configures New.
type Config struct {
	// Store keeps the waiting keys and their held messages, in the inbox's
	// database (sluicesql.NewOrders). Required.
	Store Store
	// Consumer names the handler in the Store: one order per (Consumer,
	// key). router.Add sets the handler's name. Required.
	Consumer string
	// Key returns a message's ordering key: the entity whose events must
	// apply in order (an account id, an order id) — a header
	// (sluice.KeyFromMetadata) or a JSON field (sluice.KeyFromJSON). A
	// message without one is poison. Required.
	Key func(*message.Message) (string, error)
	// Inbox is the handler's inbox (router.Add gives Stages.Inbox, named
	// after the handler, with the stages' Env). A message's event id is
	// its Key (default the metadata sluice.EventIDKey). A delivery of a
	// waiting key that is not its head asks it first whether it processed
	// the message already, and records it as a duplicate
	// (deduplication.Seen): one its key applied already — a redelivery
	// after its process died between its commit and its ack — is acked as
	// a duplicate instead of held behind the head. Default none (or an
	// Inbox without a Consumer): event ids are the metadata
	// sluice.EventIDKey, and every such delivery is held (the inbox skips a
	// duplicate when it is released, but the key counts it as held
	// meanwhile), as it is when the inbox cannot answer.
	Inbox *deduplication.Config
	// SkipPoisoned lets a key whose head went to the poison queue go on
	// without it. Default false: the key waits until an operator replays
	// the head (sluice dlq replay: it is the head again and, once it
	// succeeds, the key's held messages follow it) or skips it (sluice
	// order skip).
	SkipPoisoned bool
	// ResumeInterval is how often Run resumes unfinished releases and
	// refreshes the gauges. Default 5 s.
	ResumeInterval time.Duration
	// Released wraps the stages each released message runs through: router.Add
	// gives it the Trace stage, so that a released message has its span and
	// its outcome in the Trace stage's metrics, as a delivery has (the
	// delivery that was held counts as waiting). Default none.
	Released message.HandlerMiddleware
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). The stage reads MeterProvider (default the
	// global provider), Logger (default watermill.NopLogger; router.Add
	// gives the router's) and StoreTimeout, which bounds each call to the
	// Store (default 10 s).
	sluice.Env

	// eventID and seen are the inbox's Key and deduplication.Seen (Inbox).
	eventID func(*message.Message) (string, error)
	seen    func(*message.Message) (bool, error)
}

func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Store == nil:
		return c, errors.New("ordering: Config.Store is required")
	case c.Consumer == "":
		return c, errors.New("ordering: Config.Consumer is required")
	case c.Key == nil:
		return c, errors.New("ordering: Config.Key is required (the message's ordering key: sluice.KeyFromMetadata or KeyFromJSON)")
	case c.ResumeInterval < 0:
		return c, errors.New("ordering: Config.ResumeInterval must not be negative")
	case c.StoreTimeout < 0:
		return c, errors.New("ordering: " + inherit.Field("StoreTimeout") + " must not be negative: a negative StoreTimeout is the inbox's alone")
	}
	c.eventID = sluice.KeyFromMetadata(sluice.EventIDKey) // the inbox's default Key
	if in := c.Inbox; in != nil {
		if in.Key != nil {
			c.eventID = in.Key
		}
		if in.Consumer != "" {
			seen, err := deduplication.Seen(*in)
			if err != nil {
				return c, fmt.Errorf("ordering: Config.Inbox: %w", err)
			}
			c.seen = seen
		}
	}
	c.ResumeInterval = cmp.Or(c.ResumeInterval, resumeIntervalDefault)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, storeTimeoutDefault)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c, nil
}

// Orderer is the ordering stage of one handler: Middleware around the
// stages that decide a delivery's fate, Inner inside them, Serialize on
// its subscriber, Run beside it. router.Add wires all four
// (router.Stages.Order).
type Orderer struct {
	cfg Config

	next atomic.Pointer[message.HandlerFunc] // the stages inside Middleware

	held, released, blocked metric.Int64Counter
	reg                     metric.Registration
	attrs                   attribute.Set
	stats                   atomic.Pointer[Stats]

	// delivery holds the values of the first delivery's context (the
	// handler's name, topic, messaging system: the same for every
	// delivery), without its span: Run's releases run with them.
	delivery atomic.Pointer[context.Context]
	// budget is how long a delivery of the handler had when it reached
	// Middleware (a router's Timeout), in nanoseconds; 0 for no deadline.
	// A released message gets as long (releaseContext).
	budget atomic.Int64

	closeOnce sync.Once
	closing   chan struct{}
}

// New validates cfg and returns the handler's Orderer.
func New(cfg Config) (*Orderer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	o := &Orderer{cfg: cfg, closing: make(chan struct{})}
	m := telemetry.Meter(cfg.MeterProvider)
	var errs [6]error
	var keys, waiting metric.Int64ObservableGauge
	var oldest metric.Float64ObservableGauge
	o.held, errs[0] = m.Int64Counter(telemetry.MetricOrderHeld, metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries held behind their key's head (acked once stored)."))
	o.released, errs[1] = m.Int64Counter(telemetry.MetricOrderReleased, metric.WithUnit("{message}"),
		metric.WithDescription("Held messages released after their key's head, by sluice.outcome."))
	o.blocked, errs[2] = m.Int64Counter(telemetry.MetricOrderBlocked, metric.WithUnit("{key}"),
		metric.WithDescription("Keys that began to wait for a head in a retry tier or the poison queue."))
	keys, errs[3] = m.Int64ObservableGauge(telemetry.MetricOrderKeys, metric.WithUnit("{key}"),
		metric.WithDescription("Waiting keys, by sluice.order.state: blocked (head in a retry tier), poisoned (head in the poison queue), releasing."))
	waiting, errs[4] = m.Int64ObservableGauge(telemetry.MetricOrderWaiting, metric.WithUnit("{message}"),
		metric.WithDescription("Messages held behind waiting keys."))
	oldest, errs[5] = m.Float64ObservableGauge(telemetry.MetricOrderOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Seconds since the oldest waiting key began to wait; 0 when none waits."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("ordering: creating the metrics: %w", err)
	}
	o.attrs = attribute.NewSet(telemetry.AttrHandler.String(cfg.Consumer))
	for _, c := range []metric.Int64Counter{o.held, o.blocked} {
		c.Add(context.Background(), 0, metric.WithAttributeSet(o.attrs)) // exported at zero, for rate()
	}
	o.reg, err = m.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		s := o.stats.Load()
		if s == nil {
			return nil
		}
		for state, n := range map[string]int{"blocked": s.Blocked, "poisoned": s.Poisoned, "releasing": s.Releasing} {
			ob.ObserveInt64(keys, int64(n), metric.WithAttributeSet(attribute.NewSet(
				telemetry.AttrHandler.String(cfg.Consumer), telemetry.AttrOrderState.String(state))))
		}
		ob.ObserveInt64(waiting, int64(s.Held), metric.WithAttributeSet(o.attrs))
		age := 0.0
		if !s.Oldest.IsZero() {
			age = max(time.Since(s.Oldest).Seconds(), 0)
		}
		ob.ObserveFloat64(oldest, age, metric.WithAttributeSet(o.attrs))
		return nil
	}, keys, waiting, oldest)
	if err != nil {
		return nil, fmt.Errorf("ordering: registering the gauges: %w", err)
	}
	return o, nil
}

// Close stops Run and unregisters the gauges. It is idempotent.
func (o *Orderer) Close() error {
	var err error
	o.closeOnce.Do(func() {
		close(o.closing)
		err = o.reg.Unregister()
	})
	return err
}

type keyErrorKey struct{}

// Inner fails, as poison, a delivery whose ordering key or event id
// Middleware could not read; it goes inside the Poison stage (router.Add
// puts it just outside the inbox).
func (o *Orderer) Inner(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if err, ok := msg.Context().Value(keyErrorKey{}).(error); ok {
			return nil, sluice.Poison(err)
		}
		return h(msg)
	}
}

// Middleware orders the deliveries of each key: it goes outside the stages
// that decide a delivery's fate (Poison, Retry), so that it sees where a
// delivery went. A delivery of a key that waits for another head is held
// (stored, then acked); a delivery that went to a retry tier or the poison
// queue makes its key wait for it; once the head comes back and succeeds,
// the messages its key holds run through the same stages, in order.
func (o *Orderer) Middleware(h message.HandlerFunc) message.HandlerFunc {
	released := h
	if o.cfg.Released != nil {
		released = o.cfg.Released(h)
	}
	o.next.Store(&released)
	return func(msg *message.Message) ([]*message.Message, error) {
		key, id, kErr, idErr := o.keys(msg)
		ctx := msg.Context()
		defer msg.SetContext(ctx)
		if o.delivery.Load() == nil { // once: not a cost of every delivery
			values := trace.ContextWithSpanContext(context.WithoutCancel(ctx), trace.SpanContext{})
			o.delivery.CompareAndSwap(nil, &values)
		}
		var budget time.Duration
		if dl, ok := ctx.Deadline(); ok {
			budget = max(time.Until(dl), 1)
		}
		o.budget.Store(int64(budget))
		if kErr != nil || idErr != nil {
			err := errors.Join(wrapIf("the ordering key", kErr), wrapIf("the event id", idErr))
			msg.SetContext(context.WithValue(ctx, keyErrorKey{}, fmt.Errorf("ordering: %w", err)))
			return h(msg)
		}
		if sluice.ReportFromContext(ctx) == nil {
			c, _ := sluice.WithReport(ctx)
			msg.SetContext(c)
		}
		return o.deliver(msg, key, id, h)
	}
}

// keyed is a delivery's ordering key and event id, read once: Serialize
// reads them to order the delivery and puts them in its context, where
// Middleware finds them.
type keyed struct {
	key, id     string
	kErr, idErr error
}

type keyedKey struct{}

// keys returns msg's ordering key and event id: those Serialize read, else
// read now.
func (o *Orderer) keys(msg *message.Message) (key, id string, kErr, idErr error) {
	if k, ok := msg.Context().Value(keyedKey{}).(*keyed); ok {
		return k.key, k.id, k.kErr, k.idErr
	}
	key, kErr = o.cfg.Key(msg)
	id, idErr = o.cfg.eventID(msg)
	return key, id, kErr, idErr
}

func wrapIf(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// fate is what a delivery's run through the stages means for its key.
type fate int

const (
	fateDone    fate = iota // processed, a duplicate or rejected: the key goes on
	fateBlocked             // a copy in a retry tier: the key waits for it
	fatePoison              // a copy in the poison queue: the key waits for an operator
	fateBack                // nacked (held by the brake, a shutdown, a failure): nothing changed
)

func (o *Orderer) fateOf(r *sluice.Report, err error) fate {
	if err != nil {
		return fateBack
	}
	switch r.Outcome {
	case sluice.OutcomeRetried:
		return fateBlocked
	case sluice.OutcomeHeld: // set aside in a tier (retrytiers, a failed probe)
		if r.Tier != "" {
			return fateBlocked
		}
		return fateBack
	case sluice.OutcomePoisoned, sluice.OutcomeParked:
		if o.cfg.SkipPoisoned {
			return fateDone
		}
		return fatePoison
	}
	return fateDone
}

// bounded returns a context for one Store call: ctx's values, bounded by
// StoreTimeout, and not ended by ctx — a delivery's deadline or a shutdown
// must not leave a stored step half done (the guard's commit after a copy
// was published).
func (o *Orderer) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), o.cfg.StoreTimeout)
}

func (o *Orderer) lock(ctx context.Context, key string) (Guard, error) {
	c, cancel := o.bounded(ctx)
	defer cancel()
	g, err := o.cfg.Store.Lock(c, o.cfg.Consumer, key)
	if err != nil {
		return nil, sluice.Transient(fmt.Errorf("ordering: locking the key: %w", err))
	}
	return g, nil
}

// call runs one Guard call bounded by StoreTimeout; a failure is Transient.
func (o *Orderer) call(ctx context.Context, what string, f func(context.Context) error) error {
	c, cancel := o.bounded(ctx)
	defer cancel()
	if err := f(c); err != nil {
		return sluice.Transient(fmt.Errorf("ordering: %s: %w", what, err))
	}
	return nil
}

// lockState locks the key and reads its state; the guard is rolled back
// on error.
func (o *Orderer) lockState(ctx context.Context, key string) (g Guard, st Key, waiting bool, err error) {
	if g, err = o.lock(ctx, key); err != nil {
		return nil, st, false, err
	}
	if err = o.call(ctx, "reading the key", func(c context.Context) (err error) {
		st, waiting, err = g.State(c)
		return err
	}); err != nil {
		o.rollback(ctx, g)
		return nil, st, false, err
	}
	return g, st, waiting, nil
}

// releaseCommit releases what g's key holds (its head done) and commits.
func (o *Orderer) releaseCommit(ctx context.Context, g Guard, key string) error {
	if err := o.release(ctx, g, key); err != nil {
		return err
	}
	return o.call(ctx, "committing the release", g.Commit)
}

func (o *Orderer) rollback(ctx context.Context, g Guard) {
	_ = o.call(ctx, "rollback", g.Rollback)
}

func (o *Orderer) deliver(msg *message.Message, key, id string, h message.HandlerFunc) ([]*message.Message, error) {
	ctx := msg.Context()
	var waits bool
	if err := o.call(ctx, "reading the key", func(c context.Context) (err error) {
		waits, err = o.cfg.Store.Waits(c, o.cfg.Consumer, key)
		return err
	}); err != nil {
		return nil, err
	}
	if !waits {
		return o.run(ctx, msg, key, id, h)
	}
	g, st, waiting, err := o.lockState(ctx, key)
	if err != nil {
		return nil, err
	}
	defer o.rollback(ctx, g)
	if waiting && st.Head != id {
		if o.seen(msg, key) { // applied already: not a message to run after the head
			return nil, nil
		}
		if late := o.outOfOrder(ctx, msg, key, id, "held behind the key's head "+diag.Printable(st.Head, 200)+", after the messages it held before"); late != nil {
			late(sluice.OutcomeWaiting)
		}
		return nil, o.hold(ctx, g, st, msg, key, id)
	}
	if !waiting {
		// Nothing to guard: the key's deliveries run one at a time
		// (Serialize), and no release touches a key that does not wait.
		o.rollback(ctx, g)
		return o.run(ctx, msg, key, id, h)
	}
	// The key's head came back (from its tier, or replayed).
	out, err := h(msg)
	r := sluice.ReportFromContext(msg.Context())
	switch f := o.fateOf(r, err); f {
	case fateBack:
		return out, err
	case fateBlocked, fatePoison: // to the next tier, or poisoned: still the head
		if err := o.block(ctx, g, true, key, id, f, r.Reason); err != nil {
			return nil, err // nacked: the head comes back, to the same decision
		}
		return out, nil
	}
	// The head is done: release what its key holds.
	if err := o.call(ctx, "unblocking the key", g.Unblock); err != nil {
		return nil, err
	}
	if err := o.releaseCommit(ctx, g, key); err != nil {
		return nil, err
	}
	return out, nil
}

// seen asks the inbox (Config.Inbox) whether msg was applied already, on a
// context bounded by StoreTimeout and not by the delivery's deadline, as
// the hold's own calls are. A failure to ask is logged and msg is held, as
// without an inbox: a duplicate held is skipped by the inbox when released.
func (o *Orderer) seen(msg *message.Message, key string) bool {
	if o.cfg.seen == nil {
		return false
	}
	ctx := msg.Context()
	c, cancel := o.bounded(ctx)
	defer cancel()
	msg.SetContext(c)
	defer msg.SetContext(ctx)
	seen, err := o.cfg.seen(msg)
	if err != nil {
		o.cfg.Logger.Info("Could not ask the inbox whether a delivery of a waiting key was applied; it is held", watermill.LogFields{
			"handler": o.cfg.Consumer, "key": diag.Printable(key, 200), "error": diag.Summary(err, 200)})
		return false
	}
	return seen
}

// run runs the delivery of a key that does not wait, and makes the key wait
// for it when it went to a tier or the poison queue.
func (o *Orderer) run(ctx context.Context, msg *message.Message, key, id string, h message.HandlerFunc) ([]*message.Message, error) {
	late := o.outOfOrder(ctx, msg, key, id, "its key went on without it (its head skipped, or SkipPoisoned): it runs after the key's later messages")
	out, err := h(msg)
	r := sluice.ReportFromContext(msg.Context())
	if late != nil && r.Outcome != sluice.OutcomeDuplicate { // not settled here: the stages outside settle it
		outcome := cmp.Or(r.Outcome, sluice.OutcomeProcessed)
		if err != nil {
			outcome = sluice.OutcomeFailed
		}
		late(outcome)
	}
	switch f := o.fateOf(r, err); f {
	case fateBlocked, fatePoison:
		if err := o.block(ctx, nil, false, key, id, f, r.Reason); err != nil {
			return nil, err // nacked, back first (Serialize): it runs again before the key's next message
		}
	}
	return out, err
}

// outOfOrder warns when msg is a replay from a poison queue that its key does
// not wait for as its head: a key waits for each head it poisoned until an
// operator replays or skips it, so a replay the key does not wait for comes
// after the key went on without it — skipped, or SkipPoisoned — and applies
// after the key's later messages. It is logged and noted in the delivery's
// report (Reason: the span, and the replay stage's outcome record, which the
// console and sluice dlq report show). The header (sluice_replayed_from,
// which every replayed copy carries) is a producer's to forge: a forgery
// buys a log line.
// It returns nil for any other delivery, else the log call, given the
// delivery's outcome once known (a duplicate the inbox skipped applies
// nothing: the caller does not log it).
func (o *Orderer) outOfOrder(ctx context.Context, msg *message.Message, key, id, why string) func(sluice.Outcome) {
	from := msg.Metadata.Get(metakeys.ReplayedFrom)
	if from == "" {
		return nil
	}
	sluice.Record(ctx, func(r *sluice.Report) { r.Reason = "ordering: a replayed message out of its key's order: " + why })
	return func(outcome sluice.Outcome) {
		o.cfg.Logger.Error("A replayed message runs out of its key's order", nil, watermill.LogFields{"handler": o.cfg.Consumer,
			"key": diag.Printable(key, 200), "event_id": diag.Printable(id, 200), "replayed_from": diag.Printable(from, 255),
			"outcome": string(outcome), "why": why})
	}
}

// block makes the key wait for id; g is the key's open guard when it waited
// already (its head went to a tier again), else a new one is taken.
func (o *Orderer) block(ctx context.Context, g Guard, locked bool, key, id string, f fate, reason string) error {
	if !locked {
		var err error
		if g, err = o.lock(ctx, key); err != nil {
			return err
		}
		defer o.rollback(ctx, g)
	}
	if err := o.call(ctx, "blocking the key", func(c context.Context) error { return g.Block(c, id, f == fatePoison, reason) }); err != nil {
		return err
	}
	if err := o.call(ctx, "committing the block", g.Commit); err != nil {
		return err
	}
	if !locked {
		o.blocked.Add(ctx, 1, metric.WithAttributeSet(o.attrs))
	}
	return nil
}

// hold stores msg behind its key's head and, when the head is done (a
// release left unfinished), releases. The delivery is acked once stored.
func (o *Orderer) hold(ctx context.Context, g Guard, st Key, msg *message.Message, key, id string) error {
	m := Held{EventID: id, UUID: msg.UUID, Payload: msg.Payload, Metadata: map[string]string(msg.Metadata), HeldAt: time.Now()}
	if err := o.call(ctx, "holding the delivery", func(c context.Context) error { return g.Hold(c, m) }); err != nil {
		return err
	}
	if st.Head == "" {
		if err := o.release(ctx, g, key); err != nil {
			return err
		}
	}
	if err := o.call(ctx, "committing the hold", g.Commit); err != nil {
		return err
	}
	o.held.Add(ctx, 1, metric.WithAttributeSet(o.attrs))
	sluice.Record(ctx, func(r *sluice.Report) { r.Outcome = sluice.OutcomeWaiting })
	o.cfg.Logger.Debug("Delivery held behind its key's head", watermill.LogFields{
		"handler": o.cfg.Consumer, "key": diag.Printable(key, 200), "head": diag.Printable(st.Head, 200)})
	return nil
}

// release runs the messages g's key holds through the stages, oldest
// first, until one goes to a tier or the poison queue (it becomes the
// key's head), one is given back (it stays held, first), or releaseMax (100)
// ran; g's key was unblocked. A key that holds nothing more is removed.
func (o *Orderer) release(ctx context.Context, g Guard, key string) error {
	hp := o.next.Load()
	if hp == nil {
		return nil
	}
	h := *hp
	for range releaseMax {
		var m Held
		var ok bool
		if err := o.call(ctx, "reading the next held message", func(c context.Context) (err error) {
			m, ok, err = g.Next(c)
			return err
		}); err != nil {
			return err
		}
		if !ok {
			return o.call(ctx, "removing the released key", g.Unblock)
		}
		msg := message.NewMessage(m.UUID, m.Payload)
		for k, v := range m.Metadata {
			msg.Metadata.Set(k, v)
		}
		rctx, cancel := o.releaseContext(ctx)
		mctx, r := sluice.WithReport(rctx)
		msg.SetContext(mctx)
		_, err := h(msg)
		cancel()
		f := o.fateOf(r, err)
		outcome := r.Settle(err)
		o.released.Add(ctx, 1, metric.WithAttributeSet(o.attrs), metric.WithAttributes(telemetry.AttrOutcome.String(string(outcome))))
		if f == fateBack {
			o.cfg.Logger.Info("Release of a key paused: a held message was given back; it stays first", watermill.LogFields{
				"handler": o.cfg.Consumer, "key": diag.Printable(key, 200), "error": diag.Summary(err, 200)})
			return nil
		}
		if err := o.call(ctx, "removing the released message", func(c context.Context) error { return g.Remove(c, m.EventID) }); err != nil {
			return err
		}
		if f != fateDone {
			return o.call(ctx, "blocking the key", func(c context.Context) error { return g.Block(c, m.EventID, f == fatePoison, r.Reason) })
		}
	}
	return nil
}

// releaseContext returns a released message's context: parent's values
// (the head's delivery, or Run's), and a deadline of its own — as long as a
// delivery of the handler has (the budget Middleware saw), not what the
// head's run left of its own (a released message run past the head's
// deadline failed and spent an attempt). It ends early when parent is
// cancelled for another reason than its deadline: a shutdown.
func (o *Orderer) releaseContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	stop := context.AfterFunc(parent, func() {
		if cause := context.Cause(parent); !errors.Is(cause, context.DeadlineExceeded) {
			cancel(cause)
		}
	})
	end := func() { stop(); cancel(context.Canceled) }
	budget := time.Duration(o.budget.Load())
	if budget <= 0 {
		return ctx, end
	}
	ctx, cancelT := context.WithTimeout(ctx, budget)
	return ctx, func() { cancelT(); end() }
}

// Run resumes, every ResumeInterval, the releases a crash, a shutdown or a
// failure left unfinished (a key whose head is done but that still holds
// messages, and that no delivery of its own comes to release), and
// refreshes the gauges; until ctx ends or Close. router.Add runs it beside
// the handler.
func (o *Orderer) Run(ctx context.Context) {
	t := time.NewTicker(o.cfg.ResumeInterval)
	defer t.Stop()
	for {
		o.resume(ctx)
		select {
		case <-ctx.Done():
			return
		case <-o.closing:
			return
		case <-t.C:
		}
	}
}

// valuesFrom is a context with Context's cancellation and deadline and
// the values of values.
type valuesFrom struct {
	context.Context
	values context.Context
}

func (v valuesFrom) Value(key any) any { return v.values.Value(key) }

func (o *Orderer) resume(ctx context.Context) {
	if d := o.delivery.Load(); d != nil {
		ctx = valuesFrom{Context: ctx, values: *d}
	}
	c, cancel := context.WithTimeout(ctx, o.cfg.StoreTimeout)
	s, err := o.cfg.Store.Stats(c, o.cfg.Consumer)
	cancel()
	if err == nil {
		o.stats.Store(&s)
	}
	if o.next.Load() == nil || err != nil || s.Releasing == 0 {
		return
	}
	c, cancel = context.WithTimeout(ctx, o.cfg.StoreTimeout)
	keys, err := o.cfg.Store.Releasable(c, o.cfg.Consumer, 16)
	cancel()
	if err != nil {
		o.cfg.Logger.Error("Listing the keys to release", err, watermill.LogFields{"handler": o.cfg.Consumer})
		return
	}
	for _, key := range keys {
		if err := o.resumeKey(ctx, key); err != nil {
			o.cfg.Logger.Error("Resuming a key's release", err, watermill.LogFields{"handler": o.cfg.Consumer, "key": diag.Printable(key, 200)})
		}
	}
}

func (o *Orderer) resumeKey(ctx context.Context, key string) error {
	g, st, waiting, err := o.lockState(ctx, key)
	if err != nil {
		return err
	}
	defer o.rollback(ctx, g)
	if !waiting || st.Head != "" {
		return nil
	}
	return o.releaseCommit(ctx, g, key)
}

// Skip gives up a waiting key's head (poisoned, or in a tier): the key
// releases what it holds without it, at the next delivery of the key or
// Run. It returns the head skipped; false when the key does not wait.
// sluice order skip calls it, audited.
func Skip(ctx context.Context, s Store, consumer, key string) (Key, bool, error) {
	g, err := s.Lock(ctx, consumer, key)
	if err != nil {
		return Key{}, false, err
	}
	defer func() { _ = g.Rollback(context.WithoutCancel(ctx)) }()
	st, ok, err := g.State(ctx)
	if err != nil || !ok || st.Head == "" {
		return st, ok && st.Head != "", err
	}
	if err := g.Unblock(ctx); err != nil {
		return st, false, err
	}
	return st, true, g.Commit(ctx)
}
