package deduplication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/unitctx"
	"github.com/sluicemq/sluice/unitofwork"
)

// batchHandlerMaxBatchDefault is BatchHandler.MaxBatch's default.
const batchHandlerMaxBatchDefault = 64

// Defaults of BatchHandler.
const (
	batchHandlerMaxWaitDefault     = 5 * time.Millisecond
	batchHandlerConcurrencyDefault = 2
)

// BatchHandler is a batch handler and how its batches are gathered
// (NewBatchHandler).
type BatchHandler struct {
	// Handle handles the deliveries of one batch in one call, inside the
	// inbox's transaction: every one of msgs was claimed in it, each once
	// (a delivery whose key was processed before, or that another delivery
	// of the batch carries, is not among them). The transaction is
	// unitofwork.FromContext(ctx) — sluicesql.TxFromContext for an SQL
	// store — and each msgs[i].Context() carries it too, as the unit of
	// work of that one event: write what event i produces through it
	// (outbox.Writer.Publish(msgs[i].Context(), ...)) so that it commits,
	// or not, with the event.
	//
	// It returns each event's outcome, outcomes[i] for msgs[i] as Handle
	// leaves msgs — it may reorder them (sort them, for one order of row
	// locks), not replace them: nil (done)
	// or an error classed as ever (sluice.Reject, Transient, Poison,
	// Invariant; an unclassed error by the Classifier). A nil or empty
	// slice means every event is done. A rejected event commits with the
	// batch. An event that failed otherwise leaves the batch: the
	// transaction is rolled back and the batch runs again without it — so
	// write nothing outside the transaction — and it takes its usual path
	// alone (a retry tier, the poison queue) with its error. A panic is
	// narrowed down by halving the batch until the one event that panics
	// is found: it fails as Invariant with the *sluice.PanicError, the
	// others commit. So is one error value returned for every event of the
	// call (SameOutcome) when it is Poison or Invariant: a statement of the
	// batch failed, perhaps for one event. A slice of the wrong length
	// fails every event of the call as Invariant. On a store whose unit of
	// work holds the claims only (ClaimReleaser: the Redis inbox, the
	// MemoryStore) a batch is never run again: a failed event's claim is
	// released and the others commit, a panic fails every event of the
	// call, and one error for all is each event's.
	//
	// ctx ends when the first of the batch's deliveries' contexts ends (its
	// deadline, the shutdown grace running out). Required.
	Handle func(ctx context.Context, msgs []*message.Message) []error
	// MaxBatch is the most deliveries one batch takes. Give the consumer
	// deliveries enough in flight to fill it, twice over (a batch fills
	// while the one before it commits): rabbitmq.BrokerConfig.Prefetch.
	// Default 64; at most 1000. Give the consumer a prefetch of about
	// twice it, so that a batch gathers while the one before commits.
	MaxBatch int
	// MaxWait is the longest a batch takes in deliveries after its first.
	// It closes sooner when it is full, or when no delivery joined it for a
	// tenth of MaxWait (at least 100µs): the deliveries the broker sent
	// together are in. A batch that cannot start yet — Concurrency batches
	// running — goes on taking deliveries in until one ends. Default
	// 5 ms; at most 1s.
	MaxWait time.Duration
	// Concurrency is how many batches of the handler run at once, each on
	// a connection of its own. Default 2.
	Concurrency int
	// InFlight is the most deliveries the handler can be handed at once:
	// the subscriber's prefetch times its consumers. Once that many are in
	// the handler's batches — gathering, running or waiting for their
	// commit — no other can come until one is acked, and the batch
	// gathering closes at once instead of waiting MaxWait or a tenth of
	// it. router.Add sets it from the broker (broker.Endpoints.Prefetch ×
	// HandlerConfig.Consumers) where it is 0. 0: not known; a smaller
	// number than the truth closes batches sooner and smaller, never loses
	// a delivery.
	InFlight int
}

func (c BatchHandler) withDefaults() BatchHandler {
	c.MaxBatch = cmp.Or(c.MaxBatch, batchHandlerMaxBatchDefault)
	c.MaxWait = cmp.Or(c.MaxWait, batchHandlerMaxWaitDefault)
	c.Concurrency = cmp.Or(c.Concurrency, batchHandlerConcurrencyDefault)
	return c
}

func (c BatchHandler) validate() error {
	switch {
	case c.Handle == nil:
		return errors.New("deduplication: BatchHandler.Handle is required")
	case c.MaxBatch < 1 || c.MaxBatch > 1000:
		return fmt.Errorf("deduplication: BatchHandler.MaxBatch must be between 1 and 1000, got %d", c.MaxBatch)
	case c.MaxWait < 0 || c.MaxWait > time.Second:
		return fmt.Errorf("deduplication: BatchHandler.MaxWait must be between 0 and 1s, got %s", c.MaxWait)
	case c.Concurrency < 1:
		return fmt.Errorf("deduplication: BatchHandler.Concurrency must be positive, got %d", c.Concurrency)
	case c.InFlight < 0:
		return fmt.Errorf("deduplication: BatchHandler.InFlight must not be negative, got %d", c.InFlight)
	}
	return nil
}

// BatchClaimer is a unitofwork.Tx that claims many keys in one call: the SQL
// store's (one statement), the Redis inbox's (one round trip) and the
// MemoryStore's. ClaimBatch records (consumer, key) for each of keys (distinct)
// and returns those it recorded; a key a committed unit of work recorded
// before is left out. A key another open unit of work holds is waited for
// at most wait (0: as long as Claim waits): past it the call fails with an
// error matching ErrClaimInProgress, and the unit of work may take no
// further statement but a rollback (to a savepoint). idle > 0 bounds how
// long the unit of work may then sit idle, as IdleBounder's ClaimIdle. A
// batch handler claims through it where the store's unitofwork.Tx is one;
// elsewhere each event of a batch runs in a unit of work of its own.
type BatchClaimer interface {
	ClaimBatch(ctx context.Context, consumer string, keys []string, wait, idle time.Duration) ([]string, error)
}

// ClaimReleaser is a BatchClaimer whose unit of work holds the claims only,
// not what the handler writes: the Redis inbox's and the MemoryStore's. A
// batch handler never runs a batch on it again — what its events did cannot
// be rolled back — so an event that fails leaves the batch by ReleaseClaims,
// which gives back the claims of keys (distinct, claimed in this unit of
// work) so that a redelivery claims them anew, and the commit records the
// others'. A panic in such a batch fails each of its events (Invariant: it
// cannot tell which ran), and a failed commit or release each (Transient).
// A BatchClaimer whose unit of work is not a transaction with the handler's
// writes must be one: a batch re-run without its failed events would do the
// others' effects again.
type ClaimReleaser interface {
	BatchClaimer
	ReleaseClaims(ctx context.Context, consumer string, keys []string) error
}

// NewBatchHandler returns the handler that runs bh with the inbox of cfg:
// the deliveries in flight are gathered into batches (up to bh.MaxBatch,
// for up to bh.MaxWait); for each batch one transaction claims their keys
// in one statement (BatchClaimer), bh.Handle runs once with the events
// claimed, and one COMMIT commits the claims and the effects of every
// event that did not fail. Each delivery returns — is acked — only after
// that commit, with its own outcome: nil when done or a duplicate, its
// error otherwise (see BatchHandler.Handle). The returned function takes the
// place of the inbox stage, the recoverer and the handler: put the outer
// stages (Classify, the brake, the retry tiers, poison, tracing) around it
// as around the inbox (router.HandlerConfig.BatchHandler does).
//
// Each batch has a span ("sluice.batch"), linked to each delivery's span,
// on cfg.Env.TracerProvider (default the global OpenTelemetry provider).
// cfg.Batch (group commit) does not apply. On a store whose units of work
// claim one key only (their unitofwork.Tx is not a BatchClaimer: a store of
// your own without ClaimBatch), each event runs in a unit of work of its
// own, a batch of one: correct, not faster than a Handler.
func NewBatchHandler(cfg Config, bh BatchHandler) (message.HandlerFunc, error) {
	bh = bh.withDefaults()
	if err := bh.validate(); err != nil {
		return nil, err
	}
	cfg.Batch = nil
	d, err := newDeduplicator(cfg, time.NewTimer)
	if err != nil {
		return nil, err
	}
	if d.batchSize, err = batchSizeHistogram(cfg); err != nil {
		return nil, err
	}
	g := &gatherer{d: d, cfg: bh, slots: make(chan struct{}, bh.Concurrency),
		tracer: cmp.Or(cfg.TracerProvider, otel.GetTracerProvider()).Tracer("github.com/sluicemq/sluice/deduplication")}
	return g.handle, nil
}

// gatherer gathers one handler's deliveries into batches.
type gatherer struct {
	d      *deduplicator
	cfg    BatchHandler
	slots  chan struct{} // one per running batch
	tracer trace.Tracer

	joined int // deliveries in a batch, open or running, without its outcome yet (under mu)

	// storeFailures counts the store's failures to answer that a batch or
	// an event run alone met (a *sluice.DependencyError of the inbox's),
	// lastFailure the last of them: a batch, or an event run alone, that
	// waited for a slot across one fails with it at once (waitedAcross).
	storeFailures atomic.Int64
	lastFailure   atomic.Pointer[error]

	mu   sync.Mutex
	open *gathering // taking in deliveries, or nil
}

// gathering is one batch of deliveries.
type gathering struct {
	full    chan struct{} // closed when admission closes: the batch is full, or every delivery in flight is in the handler
	members []*entry      // under the gatherer's mu while admitting
	last    time.Time     // when the last delivery joined (under the gatherer's mu)
	closed  bool          // admission closed (under the gatherer's mu)
}

// entry is one delivery in a batch.
type entry struct {
	msg  *message.Message
	key  string
	ctx  context.Context // the message's own context
	done chan struct{}   // closed once err and again are set
	err  error
	// again: another delivery of the batch carried the key and did not
	// commit it: this one joins the next batch.
	again bool
	// unsure: the event failed in a batch whose effects are outside its
	// unit of work (ClaimReleaser) with no way to tell whether it ran (a
	// panic): a copy of it in the batch fails with its error rather than
	// run it again.
	unsure bool
	// alone: another open unit of work held the key when the batch claimed
	// it: the delivery left the batch, to run alone (runAlone), outside the
	// batches' slots while its claim waits for the holder.
	alone bool
	// single: the store's unit of work takes one claim and another event
	// of the batch took it, or takes no savepoints and a key of the batch
	// was held: the delivery runs alone (runAlone), in one of the batches'
	// slots as any batch.
	single bool
	// seen is the store failures the gatherer had met when the event was
	// made single (storeFailures).
	seen  int64
	batch *gathering // the batch it joined (under the gatherer's mu)
}

// handle is one delivery's way through its batch.
func (g *gatherer) handle(msg *message.Message) ([]*message.Message, error) {
	d := g.d
	key, err := d.key(msg)
	if err != nil {
		return nil, sluice.Poison(err)
	}
	if msg.Metadata.Get(sluice.EventIDKey) == "" {
		msg.Metadata.Set(sluice.EventIDKey, key)
	}
	ctx := msg.Context()
	for {
		e := &entry{msg: msg, key: key, ctx: ctx, done: make(chan struct{})}
		g.join(e)
		select {
		case <-e.done:
		case <-ctx.Done():
			if g.leave(e) { // not started: back unprocessed
				g.unjoin()
				return nil, endedBefore(ctx)
			}
			<-e.done // started: it commits or not, bounded by StoreTimeout
		}
		if e.alone || e.single {
			// Out of the batch, nothing claimed: a key another open unit of
			// work held (its claim waits for it, ClaimTimeout, in a unit of
			// work of its own), or a store whose unit of work takes one
			// claim. A delivery whose context ended meanwhile goes back
			// unprocessed: the store is asked nothing for it. While it runs
			// alone it counts as joined (a batch of its own): allIn closes
			// the open batch at once as ever.
			defer g.unjoin()
			if ctx.Err() != nil {
				return nil, endedBefore(ctx)
			}
			return nil, g.runAlone(e)
		}
		g.unjoin()
		if !e.again {
			return nil, e.err
		}
	}
}

// meet notes err when it is the store's not answering (storeFailures).
func (g *gatherer) meet(err error) {
	var dep *sluice.DependencyError
	if !errors.As(err, &dep) || !strings.HasPrefix(dep.Op, "deduplication: ") {
		return
	}
	g.lastFailure.Store(&err)
	g.storeFailures.Add(1)
}

// waitedAcross returns the error of deliveries that waited for a slot
// while the store failed to answer another batch (storeFailures moved
// past seen): they fail with it at once, as a Handler's deliveries in
// flight would each fail in that outage, instead of each batch waiting out
// its own bound in turn — InFlight ÷ Concurrency bounds, one after
// another, for the last. nil when none failed meanwhile.
func (g *gatherer) waitedAcross(seen int64) error {
	if g.storeFailures.Load() == seen {
		return nil
	}
	return fmt.Errorf("deduplication: not run: the store did not answer a batch while this one waited: %w", *g.lastFailure.Load())
}

// runAlone runs e in a batch of its own. One whose key was held (alone)
// runs outside the batches' slots, its claim waiting up to ClaimTimeout for
// the unit of work that holds it: a duplicate when that one commits it,
// ErrClaimInProgress (Transient) when it waits longer. One of a store whose
// unit of work takes one claim, or takes no savepoints to find the held key
// of a batch (single), waits for a slot, as a batch does: Concurrency
// bounds the units of work of such a store too. A delivery whose context
// ends while it waits goes back unprocessed.
func (g *gatherer) runAlone(e *entry) error {
	if e.single {
		select {
		case g.slots <- struct{}{}:
		case <-e.ctx.Done():
			return endedBefore(e.ctx)
		}
		defer func() { <-g.slots }()
		if e.ctx.Err() != nil { // ended as the slot came
			return endedBefore(e.ctx)
		}
		if err := g.waitedAcross(e.seen); err != nil {
			return err
		}
	}
	e.alone, e.single, e.err = false, false, nil
	ctx, span := g.startSpan([]*entry{e})
	x := &execution{g: g, ctx: ctx, span: span, alone: true}
	x.attempt([]*entry{e})
	span.SetAttributes(telemetry.AttrBatchCommitted.Int(x.committed), telemetry.AttrBatchAttempts.Int(x.attempts))
	span.End()
	x.cancel()
	g.meet(e.err)
	return e.err
}

// join admits e into the open batch, or opens one.
func (g *gatherer) join(e *entry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.joined++
	if b := g.open; b != nil {
		e.batch = b
		b.last = time.Now()
		b.members = append(b.members, e)
		if len(b.members) >= g.cfg.MaxBatch || g.allIn() {
			b.closed = true
			g.open = nil
			close(b.full)
		}
		return
	}
	b := &gathering{full: make(chan struct{}), members: []*entry{e}, last: time.Now()}
	e.batch = b
	if g.cfg.MaxBatch == 1 || g.allIn() {
		b.closed = true
		close(b.full)
	} else {
		g.open = b
	}
	go g.run(b)
}

// allIn reports whether every delivery the handler can be handed at once
// (InFlight) is in a batch, the open one or one running: none can join
// before one is acked. Called with g.mu held. It counts the deliveries
// that joined, not those inside the handler: one inside that has not
// joined yet (the goroutines of a burst, one back from a batch to join
// the next) keeps the open batch open — counting the deliveries inside
// closed a batch at each join of a burst, a batch of one each — and more
// deliveries inside than InFlight (a handler shared beyond it) close a
// batch at InFlight, not once every one of them joined.
func (g *gatherer) allIn() bool {
	return g.cfg.InFlight > 0 && g.joined >= g.cfg.InFlight
}

// unjoin notes that a delivery has its batch's outcome, or left it.
func (g *gatherer) unjoin() {
	g.mu.Lock()
	g.joined--
	g.mu.Unlock()
}

// leave takes e out of its batch if the batch has not closed: true when it
// did.
func (g *gatherer) leave(e *entry) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := e.batch
	if b.closed {
		return false
	}
	i := slices.Index(b.members, e)
	if i < 0 {
		return false
	}
	b.members = slices.Delete(b.members, i, i+1)
	if len(b.members) == 0 { // nothing left to wait for
		b.closed = true
		g.open = nil
		close(b.full)
	}
	return true
}

// run closes b after MaxWait, when full, and then once a slot is free —
// taking deliveries in while none is — and runs it.
func (g *gatherer) run(b *gathering) {
	start := time.Now()
	idle := max(g.cfg.MaxWait/10, 100*time.Microsecond)
	t := time.NewTimer(min(idle, g.cfg.MaxWait))
gather:
	for {
		select {
		case <-b.full:
			break gather
		case now := <-t.C:
			waited := now.Sub(start)
			g.mu.Lock()
			quiet := now.Sub(b.last)
			g.mu.Unlock()
			if waited >= g.cfg.MaxWait || quiet >= idle { // the deliveries sent together are in
				break gather
			}
			t.Reset(min(idle-quiet, g.cfg.MaxWait-waited))
		}
	}
	t.Stop()
	seen := g.storeFailures.Load()
	select {
	case g.slots <- struct{}{}:
	case <-b.full:
		g.mu.Lock()
		empty := len(b.members) == 0 // every delivery left it
		g.mu.Unlock()
		if empty {
			return
		}
		g.slots <- struct{}{}
	}
	defer func() { <-g.slots }()
	g.mu.Lock()
	b.closed = true
	if g.open == b {
		g.open = nil
	}
	members := withoutEnded(b.members)
	g.mu.Unlock()
	if len(members) == 0 {
		return
	}
	if err := g.waitedAcross(seen); err != nil {
		for _, e := range members {
			e.err = err
			close(e.done)
		}
		return
	}
	g.execute(members)
}

// withoutEnded settles the members whose context ended before their batch
// started — closed, full or with every delivery in flight in it, while
// Concurrency batches ran — as leave would have: back unprocessed. The
// batch's handler context ends with its first delivery's: run with them,
// every delivery of the batch would fail with them.
func withoutEnded(members []*entry) []*entry {
	live := members[:0:0]
	for _, e := range members {
		if e.ctx.Err() != nil {
			e.err = endedBefore(e.ctx)
			close(e.done)
			continue
		}
		live = append(live, e)
	}
	return live
}

// endedBefore is the error of a delivery whose context ended before its
// batch started: Transient, back unprocessed.
func endedBefore(ctx context.Context) error {
	return sluice.Transient(fmt.Errorf("deduplication: the delivery's context ended while its batch gathered: %w", context.Cause(ctx)))
}

// execute runs one closed batch: copies of a key wait for its first
// delivery's fate, the first deliveries of each key run in attempts.
func (g *gatherer) execute(members []*entry) {
	firsts := make([]*entry, 0, len(members))
	copies := map[string][]*entry{}
	seen := map[string]bool{}
	for _, e := range members {
		if seen[e.key] {
			copies[e.key] = append(copies[e.key], e)
			continue
		}
		seen[e.key] = true
		firsts = append(firsts, e)
	}
	ctx, span := g.startSpan(members)
	x := &execution{g: g, ctx: ctx, span: span}
	x.attempt(firsts)
	span.SetAttributes(telemetry.AttrBatchCommitted.Int(x.committed), telemetry.AttrBatchAttempts.Int(x.attempts))
	span.End()
	x.cancel()
	for _, e := range firsts {
		if !e.single {
			g.meet(e.err) // before any event of its runs alone
		}
	}
	for _, e := range firsts {
		// A copy of a key whose first delivery committed or was a
		// duplicate is a duplicate; otherwise it runs in a batch of its
		// own turn.
		for _, c := range copies[e.key] {
			switch {
			case e.err == nil && !e.alone && !e.single:
				g.d.duplicate(c.msg, c.key)
			case e.unsure:
				c.err = e.err
				if pe, ok := errors.AsType[*sluice.PanicError](e.err); ok {
					sluice.Record(c.ctx, func(r *sluice.Report) { r.Panic, r.Stack = true, string(pe.Stack) })
				}
			default:
				c.again = true
			}
			close(c.done)
		}
		close(e.done)
	}
}

// startSpan starts the batch's span, linked to each delivery's, on a
// context that ends when the first delivery's context ends.
func (g *gatherer) startSpan(members []*entry) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(members))
	for _, e := range members {
		if sc := trace.SpanContextFromContext(e.ctx); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := g.tracer.Start(context.Background(), telemetry.SpanBatch, trace.WithLinks(links...),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(telemetry.AttrBatchSize.Int(len(members)), telemetry.AttrConsumer.String(g.d.cfg.Consumer)))
	return ctx, span
}

// execution is the run of one batch.
type execution struct {
	g         *gatherer
	ctx       context.Context // the span's; the handler's ends with the first delivery's
	span      trace.Span
	stops     []func() bool
	committed int
	attempts  int
	// alone: a delivery out of a batch (runAlone), whose claim waits up to
	// ClaimTimeout for the key; a batch's claim waits batchClaimWait.
	alone bool
}

func (x *execution) cancel() {
	for _, stop := range x.stops {
		stop()
	}
}

// handlerContext is the handler's context: x.ctx, ended when the first of
// the deliveries' contexts ends — already ended, before the handler runs,
// when one has (context.AfterFunc would end it only from a goroutine of
// its own, after the handler began).
func (x *execution) handlerContext(es []*entry) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(x.ctx)
	for _, e := range es {
		if e.ctx.Err() != nil {
			cancel(context.Cause(e.ctx))
			break
		}
	}
	for _, e := range es {
		stop := context.AfterFunc(e.ctx, func() { cancel(context.Cause(e.ctx)) })
		x.stops = append(x.stops, stop)
	}
	return ctx, func() { cancel(nil) }
}

// attempt runs es (distinct keys) in one transaction, and whatever did not
// fail of them again, until they commit: each entry's err is its outcome.
func (x *execution) attempt(es []*entry) {
	for len(es) > 0 {
		x.attempts++
		es = x.once(es)
	}
}

// once runs es in one transaction and returns those to run again (the
// survivors of failed events, or nothing); it sets the err of every entry
// it settled.
func (x *execution) once(es []*entry) []*entry {
	d := x.g.d
	bg := context.Background()
	tx, err := d.begin(bg)
	if err != nil {
		settle(es, sluice.Transient(err))
		return nil
	}
	ended := false
	defer func() {
		if !ended {
			_ = d.rollback(bg, tx)
		}
	}()
	if _, ok := tx.(BatchClaimer); !ok && len(es) > 1 {
		// A unit of work that claims one key (unitofwork.Tx: at most one
		// Claim): the first event runs in this one, each other in one of
		// its own, a batch of one.
		seen := x.g.storeFailures.Load()
		for _, e := range es[1:] {
			e.single, e.seen = true, seen
		}
		es = es[:1]
	}

	keys := make([]string, len(es))
	for i, e := range es {
		keys[i] = e.key
	}
	idle := x.idleBound(es)
	claimed, gaveUp, err := x.claimAll(es[0].ctx, tx, keys, idle)
	if _, ok := tx.(BatchClaimer); ok && err != nil && !gaveUp && !x.alone && errors.Is(err, ErrClaimInProgress) {
		// Another open unit of work holds a key of the batch (a copy of an
		// event in another batch, not yet committed): rather than wait for
		// it with every other key held, claim again by halves, each in a
		// savepoint, and the deliveries whose keys are held leave the
		// batch to wait for them alone.
		_ = d.rollback(bg, tx)
		ended = true
		if tx, err = d.begin(bg); err != nil {
			settle(es, sluice.Transient(err))
			return nil
		}
		ended = false
		var held map[string]struct{}
		claimed, held, gaveUp, err = x.claimByHalves(tx, keys, idle)
		if err == nil && len(held) > 0 {
			kept := es[:0:0]
			seen := x.g.storeFailures.Load()
			_, savepoints := tx.(unitofwork.Savepointer)
			for _, e := range es {
				if _, ok := held[e.key]; ok {
					// Without savepoints every key of the batch is
					// "held": each runs alone in a slot (single), or
					// a batch of 64 would run 64 units of work at
					// once beside the slots.
					e.alone, e.single, e.seen = savepoints, !savepoints, seen
					continue
				}
				kept = append(kept, e)
			}
			es = kept
		}
	}
	if err != nil {
		ended = gaveUp // the claim still holds tx
		settle(es, sluice.Transient(err))
		return nil
	}
	run := make([]*entry, 0, len(claimed))
	for _, e := range es {
		if _, ok := claimed[e.key]; ok {
			run = append(run, e)
			continue
		}
		d.duplicate(e.msg, e.key)
		e.err = nil
	}
	if len(run) == 0 {
		return nil
	}

	units := make([]*unitctx.Unit[unitofwork.Tx], len(run))
	msgs := make([]*message.Message, len(run))
	for i, e := range run {
		units[i] = unitctx.New[unitofwork.Tx](e.ctx, tx, e.msg.Metadata.Get(sluice.EventIDKey))
		msgs[i] = e.msg
		e.msg.SetContext(units[i])
	}
	hctx, cancel := x.handlerContext(run)
	outcomes, panicked := x.call(unitctx.New[unitofwork.Tx](hctx, tx, ""), msgs)
	var gone error // a delivery's context ended under the handler (a shutdown)
	if hctx.Err() != nil {
		gone = context.Cause(hctx)
	}
	cancel()
	for i := range outcomes {
		// What the handler's statements fail with once its context ended
		// (the driver's "bad connection", a canceled statement) is that end:
		// the deliveries go back unprocessed, not a database's failure.
		if outcomes[i] != nil && gone != nil && !errors.Is(outcomes[i], gone) {
			outcomes[i] = fmt.Errorf("%w (the deliveries' context ended: %w)", outcomes[i], gone)
		}
	}
	for _, e := range run {
		e.msg.SetContext(e.ctx)
	}
	if _, ok := tx.(ClaimReleaser); ok && panicked != nil && len(run) > 1 {
		// What ran before the panic cannot be rolled back: running the
		// batch again by halves would do it again. Each event fails with
		// the panic.
		for _, e := range run {
			sluice.Record(e.ctx, func(r *sluice.Report) { r.Panic, r.Stack = true, string(panicked.Stack) })
			e.err = &sluice.Failure{Class: sluice.ClassInvariant, Err: panicked}
			e.unsure = true
		}
		return nil
	}
	if panicked != nil {
		if len(run) == 1 {
			sluice.Record(run[0].ctx, func(r *sluice.Report) { r.Panic, r.Stack = true, string(panicked.Stack) })
			run[0].err = &sluice.Failure{Class: sluice.ClassInvariant, Err: panicked}
			_, run[0].unsure = tx.(ClaimReleaser)
			return nil
		}
		_ = d.rollback(bg, tx)
		ended = true
		half := len(run) / 2
		x.attempt(run[:half])
		return run[half:]
	}
	if outcomes == nil {
		outcomes = make([]error, len(run))
	}
	if len(outcomes) != len(run) {
		settle(run, sluice.Invariant(fmt.Errorf("deduplication: the batch handler returned %d outcomes for %d events", len(outcomes), len(run))))
		return nil
	}
	if rel, ok := tx.(ClaimReleaser); ok && len(run) > 1 {
		ended = x.settleOutside(tx, rel, run, units, outcomes)
		return nil
	}
	if len(run) > 1 && x.batchsFailure(outcomes) {
		// One error for every event, Poison or Invariant: a statement of
		// the batch failed (a constraint one event's row violates, say),
		// not each event. Halved, as a panic is, until the events it is
		// theirs are found; the others commit.
		_ = d.rollback(bg, tx)
		ended = true
		half := len(run) / 2
		x.attempt(run[:half])
		return run[half:]
	}
	var survivors []*entry
	kept := make([]*unitctx.Unit[unitofwork.Tx], 0, len(run))
	var rejected []int
	for i, e := range run {
		err := outcomes[i]
		if err != nil && d.cfg.Classifier.Classify(err) != sluice.ClassRejected {
			e.err = err
			continue
		}
		if err != nil {
			rejected = append(rejected, i)
		}
		e.err = err
		survivors = append(survivors, e)
		kept = append(kept, units[i])
	}
	if len(survivors) < len(run) {
		return survivors // rolled back by the deferred call: run again without the failed
	}
	gaveUp, cErr := d.commit(bg, tx)
	ended = true
	switch {
	case cErr == nil:
		x.committed += len(run)
		d.batchSize.Record(bg, int64(len(run)), telemetry.DeliveryAttr(run[0].msg))
		for _, u := range kept {
			u.Committed()
		}
		return nil
	case gaveUp || !commitOfTheBatch(cErr):
		// Unknown outcome, or the database's failure: each fails as
		// Transient; a redelivery finds its claim committed or not.
		settle(run, sluice.Transient(errors.Join(append(errs(run), fmt.Errorf("deduplication: commit: %w", cErr))...)))
		if !gaveUp {
			_ = d.rollback(bg, tx)
		}
		return nil
	case len(run) == 1:
		e := run[0]
		if len(rejected) == 1 && errors.Is(cErr, unitofwork.ErrAborted) {
			// A rejection after a statement that aborted the
			// transaction: its claim alone, as without batching
			// (claimAlone rolls tx back first).
			rErr := d.claimAlone(bg, tx, e.key, units[0].Rewrites())
			switch {
			case rErr == nil:
				x.committed++
				units[0].Committed()
				return nil
			case errors.Is(rErr, errProcessedMeanwhile):
				d.duplicate(e.msg, e.key)
				e.err = nil
				return nil
			}
			cErr = errors.Join(cErr, rErr)
		} else {
			_ = d.rollback(bg, tx)
		}
		e.err = sluice.Transient(errors.Join(e.err, fmt.Errorf("deduplication: commit: %w", cErr)))
		return nil
	}
	// The commit failed for one of the batch's events (a deferred
	// constraint, a rejection whose statement aborted the transaction):
	// halve until it commits without it.
	_ = d.rollback(bg, tx)
	for _, e := range run {
		e.err = nil
	}
	half := len(run) / 2
	x.attempt(run[:half])
	return run[half:]
}

// statement runs f, one statement of tx, within StoreTimeout; one given up
// (gaveUp) still holds tx, which its late return rolls back.
func (d *deduplicator) statement(tx unitofwork.Tx, f func(context.Context) error) (gaveUp bool, err error) {
	bg := context.Background()
	if d.storeBound <= 0 {
		return false, f(bg)
	}
	_, gaveUp, err = bounded.Run(d.calls, bg, d.storeBound, false, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, f(ctx)
	}, func(struct{}, error) { d.lateRollback(bg, tx) })
	return gaveUp, err
}

// settleOutside ends a batch of run on a unit of work that holds the
// claims only (ClaimReleaser), after its handler ran once, without running
// it again: the claims of the events that failed (not rejected) are
// released, the others' committed. A release or commit that fails fails
// each event (Transient: a redelivery finds its claim committed or not).
// It reports whether tx ended.
func (x *execution) settleOutside(tx unitofwork.Tx, rel ClaimReleaser, run []*entry, units []*unitctx.Unit[unitofwork.Tx], outcomes []error) bool {
	d := x.g.d
	bg := context.Background()
	var failed []string
	kept := make([]*unitctx.Unit[unitofwork.Tx], 0, len(run))
	for i, e := range run {
		e.err = outcomes[i]
		if e.err != nil && d.cfg.Classifier.Classify(e.err) != sluice.ClassRejected {
			failed = append(failed, e.key)
			continue
		}
		kept = append(kept, units[i])
	}
	if len(kept) == 0 {
		return false // the deferred rollback releases every claim
	}
	// A failed release or commit: the events that failed keep their own
	// error (their claims are rolled back), every other fails Transient.
	failedKey := make(map[string]bool, len(failed))
	for _, k := range failed {
		failedKey[k] = true
	}
	fail := func(op string, err error) {
		opErr := fmt.Errorf("deduplication: %s: %w", op, err)
		for _, e := range run {
			if !failedKey[e.key] {
				e.err = sluice.Transient(errors.Join(e.err, opErr))
			}
		}
	}
	if len(failed) > 0 {
		gaveUp, err := d.statement(tx, func(ctx context.Context) error { return rel.ReleaseClaims(ctx, d.cfg.Consumer, failed) })
		if err != nil {
			fail("releasing the failed events' claims", err)
			return gaveUp
		}
	}
	gaveUp, err := d.commit(bg, tx)
	if err != nil {
		fail("commit", err)
		return gaveUp
	}
	x.committed += len(kept)
	d.batchSize.Record(bg, int64(len(kept)), telemetry.DeliveryAttr(run[0].msg))
	for _, u := range kept {
		u.Committed()
	}
	return true
}

// batchsFailure reports whether outcomes fail every event with the same
// error of class Poison or Invariant: the batch's statement's, not each
// event's. (A Transient one — the database unreachable — is every event's:
// halving would only wait on it again.)
func (x *execution) batchsFailure(outcomes []error) bool {
	first := outcomes[0]
	if first == nil {
		return false
	}
	switch x.g.d.cfg.Classifier.Classify(first) {
	case sluice.ClassPoison, sluice.ClassInvariant:
	default:
		return false
	}
	for _, o := range outcomes[1:] {
		if !sameError(o, first) {
			return false
		}
	}
	return true
}

// sameError reports whether a and b are the same error value. One of an
// uncomparable type (a slice, as validator.ValidationErrors; a struct
// holding one) would make == panic in the batch's goroutine, the process
// with it: such an error is never the same as another, each event's own.
func sameError(a, b error) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b //nolint:errorlint // the same error value, not one that wraps it
}

// SameOutcome returns err as the outcome of each of msgs, for a batch
// handler whose one statement wrote every event: nil (all done) when err is
// nil. When that error fails a batch of more than one event as Poison or
// Invariant (a constraint one event's row violates), the batch is halved
// until the events it belongs to are found: the others commit — except on
// a store whose unit of work holds the claims only (ClaimReleaser), where
// it is each event's outcome.
func SameOutcome(msgs []*message.Message, err error) []error {
	if err == nil {
		return nil
	}
	out := make([]error, len(msgs))
	for i := range out {
		out[i] = err
	}
	return out
}

func errs(es []*entry) []error {
	var out []error
	for _, e := range es {
		if e.err != nil {
			out = append(out, e.err)
		}
	}
	return out
}

func settle(es []*entry, err error) {
	for _, e := range es {
		e.err = err
	}
}

// call runs the handler, recovering a panic.
func (x *execution) call(ctx context.Context, msgs []*message.Message) (outcomes []error, p *sluice.PanicError) {
	returned := false
	defer func() {
		if !returned {
			r := recover()
			if r == nil {
				r = "batch handler exited without returning (runtime.Goexit)"
			}
			outcomes, p = nil, &sluice.PanicError{Value: r, Stack: debug.Stack()}
			x.span.RecordError(p)
			x.span.SetStatus(codes.Error, "panic")
		}
	}()
	view := slices.Clone(msgs) // the handler's: it may reorder it
	outcomes = x.g.cfg.Handle(ctx, view)
	returned = true
	return inBatchOrder(msgs, view, outcomes), nil
}

// inBatchOrder returns outcomes, which the handler gave for view (msgs as
// it left them: sorted, say), in msgs' order. A view that is not msgs
// reordered (an element replaced or repeated) fails every event as
// Invariant. Outcomes of the wrong length are returned as they are (the
// caller fails them).
func inBatchOrder(msgs, view []*message.Message, outcomes []error) []error {
	if len(outcomes) != len(msgs) || slices.Equal(msgs, view) {
		return outcomes
	}
	at := make(map[*message.Message]int, len(msgs))
	for i, m := range msgs {
		at[m] = i
	}
	ordered := make([]error, len(msgs))
	for i, m := range view {
		j, ok := at[m]
		delete(at, m) // a message repeated is not found twice
		if !ok {
			err := sluice.Invariant(errors.New("deduplication: the batch handler replaced or repeated messages of its batch (it may reorder them, not change them)"))
			for k := range ordered {
				ordered[k] = err
			}
			return ordered
		}
		ordered[j] = outcomes[i]
	}
	return ordered
}

// claimAll claims keys in tx, in one statement where the store can:
// the keys claimed, as a set. The statement waits for a key another open
// unit of work holds batchClaimWait in a batch (then it fails matching
// ErrClaimInProgress, the unit of work aborted), ClaimTimeout alone — with
// a negative ClaimTimeout, as long as first's delivery lasts: first is the
// context of keys[0]'s delivery.
func (x *execution) claimAll(first context.Context, tx unitofwork.Tx, keys []string, idle time.Duration) (map[string]struct{}, bool, error) {
	d := x.g.d
	bc, ok := tx.(BatchClaimer)
	if !ok { // one key: once runs the other events of a batch alone
		ok, gaveUp, err := d.claim(first, tx, keys[0])
		if err != nil || !ok {
			return nil, gaveUp, err
		}
		return map[string]struct{}{keys[0]: {}}, false, nil
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted) // one order of row locks for every batch: no deadlock between two claims
	// A batch's claim, on no delivery's context; a lone delivery's on
	// its own, as without a batch: with a negative ClaimTimeout it waits
	// as long as the delivery lasts.
	ctx, wait, bound := context.Background(), batchClaimWait, d.within(batchClaimWait)
	if x.alone {
		ctx, wait, bound = first, max(d.cfg.ClaimTimeout, 0), d.claimBound()
	}
	got, gaveUp, err := x.claimStatement(ctx, tx, bc, sorted, wait, idle, bound)
	if err != nil {
		return nil, gaveUp, err
	}
	claimed := make(map[string]struct{}, len(got))
	for _, k := range got {
		claimed[k] = struct{}{}
	}
	return claimed, false, nil
}

// claimStatement runs one ClaimBatch of keys (sorted), waiting wait for a
// key held elsewhere (0: no bound but ctx), on ctx within bound (≤ 0: no
// bound but ctx).
func (x *execution) claimStatement(ctx context.Context, tx unitofwork.Tx, bc BatchClaimer, keys []string, wait, idle, bound time.Duration) ([]string, bool, error) {
	d := x.g.d
	f := func(ctx context.Context) ([]string, error) {
		return bc.ClaimBatch(ctx, d.cfg.Consumer, keys, wait, idle)
	}
	var got []string
	var gaveUp bool
	var err error
	if bound <= 0 {
		got, err = f(ctx)
	} else {
		got, gaveUp, err = bounded.Run(d.calls, ctx, bound, false, f, func([]string, error) { d.lateRollback(ctx, tx) })
	}
	switch {
	case err == nil:
		return got, false, nil
	case errors.Is(err, ErrClaimInProgress):
		return nil, false, err
	}
	return nil, gaveUp, dependency(ctx, fmt.Sprintf("claiming a batch of %d keys", len(keys)), err)
}

// claimByHalves claims keys in tx, a unit of work begun for it, by halves:
// each part in a savepoint, waiting batchClaimWait for a key another unit
// of work holds; a part that waited longer is rolled back to its savepoint
// and split, down to the single keys held, returned apart. A store whose
// units of work take no savepoints has every key of a conflict held.
func (x *execution) claimByHalves(tx unitofwork.Tx, keys []string, idle time.Duration) (claimed, held map[string]struct{}, gaveUp bool, err error) {
	claimed, held = map[string]struct{}{}, map[string]struct{}{}
	bc, _ := tx.(BatchClaimer)
	sp, ok := tx.(unitofwork.Savepointer)
	if bc == nil || !ok {
		for _, k := range keys {
			held[k] = struct{}{}
		}
		return claimed, held, false, nil
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	d := x.g.d
	const name = "sluice_claim"
	var part func(keys []string) error
	exec := func(op string, f func(context.Context) error) error {
		if gaveUp, err = d.statement(tx, f); err != nil {
			return &sluice.DependencyError{Op: "deduplication: " + op, Err: err}
		}
		return nil
	}
	part = func(keys []string) error {
		if err := exec("savepoint", func(ctx context.Context) error { return sp.Savepoint(ctx, name) }); err != nil {
			return err
		}
		got, g, err := x.claimStatement(context.Background(), tx, bc, keys, batchClaimWait, idle, d.within(batchClaimWait))
		switch {
		case err == nil:
			for _, k := range got {
				claimed[k] = struct{}{}
			}
			return exec("release savepoint", func(ctx context.Context) error { return sp.Release(ctx, name) })
		case g || !errors.Is(err, ErrClaimInProgress):
			gaveUp = g
			return err
		}
		if err := exec("rollback to savepoint", func(ctx context.Context) error { return sp.RollbackTo(ctx, name) }); err != nil {
			return err
		}
		if err := exec("release savepoint", func(ctx context.Context) error { return sp.Release(ctx, name) }); err != nil {
			return err
		}
		if len(keys) == 1 {
			held[keys[0]] = struct{}{}
			return nil
		}
		half := len(keys) / 2
		if err := part(keys[:half]); err != nil {
			return err
		}
		return part(keys[half:])
	}
	if err := part(sorted); err != nil {
		return nil, nil, gaveUp, err
	}
	return claimed, held, false, nil
}

// idleBound is how long the batch's unit of work may sit idle
// (IdleBounder's bound, set by the claim): while the handler runs, up to
// the first of the deliveries' deadlines, then its commit within
// StoreTimeout — none when no delivery has a deadline.
func (x *execution) idleBound(es []*entry) time.Duration {
	var first time.Time
	for _, e := range es {
		if dl, ok := e.ctx.Deadline(); ok && (first.IsZero() || dl.Before(first)) {
			first = dl
		}
	}
	if first.IsZero() {
		return 0
	}
	return max(time.Until(first), 0) + max(x.g.d.cfg.StoreTimeout, 0) + idleGrace
}

// batchSizeHistogram is the histogram of the deliveries one commit
// committed (group commit, a batch handler).
func batchSizeHistogram(cfg Config) (metric.Int64Histogram, error) {
	h, err := telemetry.Meter(cfg.MeterProvider).Int64Histogram(telemetry.MetricInboxBatchSize,
		metric.WithDescription("Deliveries committed by one commit of a batch (group commit, a batch handler)."), metric.WithUnit("{delivery}"),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000))
	if err != nil {
		return nil, fmt.Errorf("deduplication: creating %s histogram: %w", telemetry.MetricInboxBatchSize, err)
	}
	return h, nil
}
