package outbox

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
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Defaults of RelayConfig.
const (
	batchSizeDefault      = 500
	batchBytesDefault     = 16 << 20
	pollIntervalDefault   = 500 * time.Millisecond
	publishTimeoutDefault = 30 * time.Second
	storeTimeoutDefault   = 10 * time.Second
	retryMinDefault       = time.Second
	retryMaxDefault       = time.Minute
	statsIntervalDefault  = 5 * time.Second
	maxAttemptsDefault    = 20
)

// A failed row's next attempt is decided on the database's clock: the
// relay looks for it retrySlack after its own clock says it is due, and
// again every retrySlack for retryGrace.
const (
	retrySlack = 20 * time.Millisecond
	retryGrace = time.Second
)

// storeCallsMax bounds the store calls given up that may still go on.
const storeCallsMax = 64

// The relay's own backoff, while its store fails or no broker answers:
// from backoffMin, doubled, at most backoffMax (or RetryMin if shorter).
const (
	backoffMin = 50 * time.Millisecond
	backoffMax = 5 * time.Second
)

// RelayConfig configures NewRelay: the relay's own settings (the store and
// the publisher are NewRelay's arguments), all optional. The relay's
// metrics and logs are labelled (the attribute sluice.outbox) with its
// store's table name, when the store has one (a Name() method, as
// sluicesql.Outbox), else "outbox".
type RelayConfig struct {
	// BatchSize is how many rows one batch takes, publishes at once
	// (pipelined, per topic, with a broker.EachPublisher) and deletes in
	// one statement. Default 500.
	BatchSize int
	// BatchBytes bounds a batch's payloads and metadata, in bytes, with a
	// store that can (sluicesql.Outbox): a batch takes rows
	// up to BatchSize and up to BatchBytes — at least one row, however
	// large. Memory: about Concurrency × BatchBytes. Default 16 MiB.
	BatchBytes int64
	// Concurrency is how many batches the relay has in flight at once, each
	// with rows of its own, as several relays have: one batch's round trips
	// to the database overlap another's publishes. Its batches are then not
	// ordered with each other. Memory: Concurrency batches. Default 1, at
	// most 64.
	Concurrency int
	// PollInterval is the longest a committed row waits for the relay when
	// nothing wakes it (a commit on another process, a producer that does
	// not call its store's Wake, as sluicesql.Outbox.Wake). Rows committed
	// through the inbox of this process wake it at once. Default 500 ms.
	PollInterval time.Duration
	// RetryMin and RetryMax bound the wait before a failed row is tried
	// again: RetryMin doubled per failed attempt, at most RetryMax. A row
	// whose broker could not be reached at all is not pushed back: the relay
	// backs off instead (50 ms doubled, at most 5 s or RetryMin), so an
	// outage does not push every row back by RetryMax.
	// Defaults 1 s and 1 min.
	RetryMin, RetryMax time.Duration
	// MaxAttempts is how many failed publishes a row gets: the row that
	// fails its MaxAttempts-th is set aside as dead, with its last error —
	// tried no more, counted (sluice.outbox.dead_lettered, sluice.outbox.dead), listed by
	// `sluice outbox list --dead`, and kept until an operator requeues or
	// discards it (`sluice outbox requeue|discard`). Attempts no broker
	// answered (unreachable) do not count, nor do those of rows given back
	// untried after another row closed their channel (Failed.Uncounted).
	// Default 20
	// (about 17 minutes of tries with the default RetryMin and RetryMax).
	MaxAttempts int
	// StatsInterval is how often the relay reads Store.Stats for its gauges
	// (pending, failing, oldest age). Default 5 s;
	// negative: never.
	StatsInterval time.Duration
	// Env is the shared environment (service gives its own; the fields set
	// here win). The relay reads MeterProvider, which receives its metrics
	// (default the global one); Logger, a line per batch with failures and
	// per store error (default watermill.NopLogger); PublishTimeout, which
	// bounds one batch's publishes (and each message's context): a publish
	// that has not returned by then counts as failed (uncertain: the row is
	// sent again later) (default 30 s); StoreTimeout, which bounds each call
	// to the store (default 10 s).
	sluice.Env

	name string // the store's table name, or "outbox"
}

func (c RelayConfig) withDefaults(store Store) RelayConfig {
	c.name = "outbox"
	if n, ok := store.(interface{ Name() string }); ok {
		c.name = cmp.Or(n.Name(), c.name)
	}
	c.BatchSize = cmp.Or(c.BatchSize, batchSizeDefault)
	c.BatchBytes = cmp.Or(c.BatchBytes, batchBytesDefault)
	c.Concurrency = cmp.Or(c.Concurrency, 1)
	c.PollInterval = cmp.Or(c.PollInterval, pollIntervalDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, publishTimeoutDefault)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, storeTimeoutDefault)
	c.RetryMin = cmp.Or(c.RetryMin, retryMinDefault)
	c.RetryMax = cmp.Or(c.RetryMax, retryMaxDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, statsIntervalDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, maxAttemptsDefault)
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	return c
}

func (c RelayConfig) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PollInterval", c.PollInterval}, {"PublishTimeout", c.PublishTimeout}, {"StoreTimeout", c.StoreTimeout}, {"RetryMin", c.RetryMin}, {"RetryMax", c.RetryMax}} {
		if d.v < 0 {
			return fmt.Errorf("outbox: RelayConfig.%s must not be negative, got %s", d.name, d.v)
		}
	}
	switch {
	case c.BatchSize < 0 || c.BatchSize > 10000:
		return fmt.Errorf("outbox: RelayConfig.BatchSize must be between 1 and 10000, got %d", c.BatchSize)
	case c.Concurrency < 0 || c.Concurrency > 64:
		return fmt.Errorf("outbox: RelayConfig.Concurrency must be between 1 and 64, got %d", c.Concurrency)
	case c.BatchBytes < 0:
		return fmt.Errorf("outbox: RelayConfig.BatchBytes must not be negative, got %d", c.BatchBytes)
	case c.MaxAttempts < 0:
		return fmt.Errorf("outbox: RelayConfig.MaxAttempts must be at least 1, got %d", c.MaxAttempts)
	case c.RetryMax < c.RetryMin:
		return fmt.Errorf("outbox: RelayConfig.RetryMax (%s) must not be shorter than RetryMin (%s)", c.RetryMax, c.RetryMin)
	}
	return nil
}

// Relay publishes the outbox's rows: it takes a batch of due rows, publishes
// each to its topic, deletes those the broker confirmed and records the
// others with their error and a later attempt — never dropped, and never in
// the way of the rest. Several relays may run at once, in one process or
// many: a batch is held by one (on PostgreSQL, FOR UPDATE SKIP LOCKED). A
// row is published at least once: a relay that stops between a confirm and
// its delete sends it again, with the same message id and event id.
type Relay struct {
	cfg       RelayConfig
	store     Store
	publisher message.Publisher
	stores    <-chan struct{} // the store's wake-ups, or nil
	closing   chan struct{}
	done      chan struct{} // closed when Run returns
	// mu orders Run's start with Close: a Run that starts after Close
	// takes nothing, and a Close after Run started waits for it.
	mu      sync.Mutex
	closed  bool
	running bool

	relayed, failures, deadLettered metric.Int64Counter
	lag                             metric.Float64Histogram
	attrs                           metric.MeasurementOption
	stats                           atomic.Pointer[readStats] // the last Stats read
	reg                             metric.Registration
	calls                           *bounded.Calls // the store calls' bounds
}

// NewRelay validates cfg and returns a Relay of store's rows (sluicesql.Outbox)
// on publisher, which publishes each row to its topic and returns nil only
// once the broker holds it: rabbitmq's Broker.Publisher() or Publisher
// (confirms + mandatory), the embedded default's. Run runs it.
func NewRelay(store Store, publisher message.Publisher, cfg RelayConfig) (*Relay, error) {
	switch {
	case store == nil:
		return nil, errors.New("outbox: NewRelay: the Store is required")
	case publisher == nil:
		return nil, errors.New("outbox: NewRelay: the Publisher is required (a publisher that returns once the broker holds the message: rabbitmq's confirmed Publisher)")
	}
	cfg = cfg.withDefaults(store)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, store: store, publisher: publisher, closing: make(chan struct{}), done: make(chan struct{}),
		calls: &bounded.Calls{Max: storeCallsMax, Timeout: context.DeadlineExceeded}}
	r.stores = store.Wakeups()
	m := telemetry.Meter(cfg.MeterProvider)
	var errs [8]error
	var pending, failing, dead metric.Int64ObservableGauge
	var oldest metric.Float64ObservableGauge
	r.relayed, errs[0] = m.Int64Counter(telemetry.MetricOutboxRelayed, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows published and confirmed, then deleted."))
	r.failures, errs[1] = m.Int64Counter(telemetry.MetricOutboxFailures, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows whose publish failed (kept, tried again later), by error.type."))
	r.lag, errs[2] = m.Float64Histogram(telemetry.MetricOutboxLag, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(telemetry.DurationBuckets...),
		metric.WithDescription("From an outbox row's write to its publish's confirm."))
	pending, errs[3] = m.Int64ObservableGauge(telemetry.MetricOutboxPending, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows not yet relayed, failing ones included."))
	failing, errs[4] = m.Int64ObservableGauge(telemetry.MetricOutboxFailing, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows whose last publish failed."))
	oldest, errs[5] = m.Float64ObservableGauge(telemetry.MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest outbox row; 0 when the outbox is empty."))
	r.deadLettered, errs[6] = m.Int64Counter(telemetry.MetricOutboxDeadLettered, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows set aside as dead after MaxAttempts failed publishes."))
	dead, errs[7] = m.Int64ObservableGauge(telemetry.MetricOutboxDead, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows set aside as dead, waiting for an operator's requeue or discard."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("outbox: creating the relay's metrics: %w", err)
	}
	set := attribute.NewSet(telemetry.AttrOutbox.String(cfg.name))
	r.attrs = metric.WithAttributeSet(set)
	r.deadLettered.Add(context.Background(), 0, r.attrs) // exported at zero, for the alerts' rate()
	r.failures.Add(context.Background(), 0, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(cfg.name), semconv.ErrorTypeKey.String("store"))))
	if cfg.StatsInterval > 0 {
		reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			s := r.stats.Load()
			if s == nil {
				return nil
			}
			o.ObserveInt64(pending, s.Pending, metric.WithAttributeSet(set))
			o.ObserveInt64(failing, s.Failing, metric.WithAttributeSet(set))
			o.ObserveInt64(dead, s.Dead, metric.WithAttributeSet(set))
			age := 0.0
			if !s.Oldest.IsZero() {
				age = s.oldestAge().Seconds()
			}
			o.ObserveFloat64(oldest, age, metric.WithAttributeSet(set))
			return nil
		}, pending, failing, dead, oldest)
		if err != nil {
			return nil, fmt.Errorf("outbox: registering the relay's gauges: %w", err)
		}
		r.reg = reg
	}
	return r, nil
}

// Run relays until ctx ends or Close is called, then returns once the
// batches in flight are finished (their publishes bounded by
// PublishTimeout): rows not
// taken stay in the outbox for the next run. It returns nil after Close or
// a cancelled ctx, and an error when called twice.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	switch {
	case r.running:
		r.mu.Unlock()
		return errors.New("outbox: Relay.Run called twice")
	case r.closed: // Close, then Run: nothing is taken
		r.mu.Unlock()
		return nil
	}
	r.running = true
	r.mu.Unlock()
	defer close(r.done)
	if r.reg != nil {
		defer func() { _ = r.reg.Unregister() }()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	var statsDone chan struct{}
	if r.cfg.StatsInterval > 0 {
		statsDone = make(chan struct{})
		go func() {
			defer close(statsDone)
			r.readStats(ctx)
		}()
	}
	var loops sync.WaitGroup
	for range r.cfg.Concurrency {
		loops.Go(func() { r.loop(ctx) })
	}
	loops.Wait()
	if statsDone != nil {
		<-statsDone
	}
	return nil
}

// loop takes batch after batch until ctx ends: the relay runs
// Concurrency of them.
func (r *Relay) loop(ctx context.Context) {
	backoff := time.Duration(0)
	var retry time.Time // the earliest next attempt of a row this loop failed, if any
	for ctx.Err() == nil && !r.closingNow() {
		n, ok, next := r.batch(ctx)
		if !next.IsZero() && (retry.IsZero() || next.Before(retry)) {
			retry = next
		}
		switch {
		case !ok: // the store failed, or the broker could not be reached at all
			// Not woken by commits: during an outage they would make it
			// read the same batch again and again.
			backoff = min(max(2*backoff, backoffMin), min(r.cfg.RetryMin, backoffMax))
			r.sleep(ctx, backoff, false)
		case n == r.cfg.BatchSize: // more may be waiting
			backoff = 0
		default:
			backoff = 0
			wait := r.cfg.PollInterval
			if !retry.IsZero() {
				if time.Since(retry) > retryGrace {
					retry = time.Time{} // taken by now, here or by another relay
				} else {
					// A failed row is due before the next poll: wake for it,
					// and look again shortly after while the database's clock,
					// which decides, may not have reached it.
					wait = min(wait, max(time.Until(retry), 0)+retrySlack)
				}
			}
			r.sleep(ctx, wait, true)
		}
	}
}

// closingNow reports whether Close was called: the loops take no batch
// after it, even before Run's context is cancelled.
func (r *Relay) closingNow() bool {
	select {
	case <-r.closing:
		return true
	default:
		return false
	}
}

// sleep waits d, until ctx ends, or, when wakeable, until a wake-up.
func (r *Relay) sleep(ctx context.Context, d time.Duration, wakeable bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	stores := r.stores
	if !wakeable {
		stores = nil
	}
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-stores:
	}
}

// Close stops the relay: Run finishes the batch in flight — one whose
// publishes began before Close was called (one per Concurrency loop): its
// publishes, bounded by PublishTimeout, and its record — and returns. A
// batch whose taking ends after Close was called is given back unpublished,
// and none is taken after: a Run called after Close returns nil at once.
// Close takes effect when it is called: called on a goroutine of its own
// (it waits for Run), when that goroutine runs.
// Close waits for it, at most PublishTimeout plus twice StoreTimeout, and is
// idempotent.
func (r *Relay) Close() error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.closing)
	}
	running := r.running
	r.mu.Unlock()
	if !running {
		return nil
	}
	t := time.NewTimer(r.cfg.PublishTimeout + 2*r.cfg.StoreTimeout)
	defer t.Stop()
	select {
	case <-r.done:
		return nil
	case <-t.C:
		return fmt.Errorf("outbox: the relay %s did not stop within %s: a store or publisher call did not return", r.cfg.name, r.cfg.PublishTimeout+2*r.cfg.StoreTimeout)
	}
}

func (r *Relay) readStats(ctx context.Context) {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		s, err := storeCall(r, ctx, false, r.store.Stats, nil)
		if err == nil {
			r.stats.Store(&readStats{Stats: s, at: time.Now()})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readStats is a Stats and when it was read.
type readStats struct {
	Stats
	at time.Time
}

// oldestAge is the oldest row's age now: its age when read, on the
// database's clock, plus the time since on the process's monotonic clock —
// never a database time subtracted from the process's clock, which a skew
// between the two hosts would make wrong.
func (s *readStats) oldestAge() time.Duration {
	if s.OldestAge > 0 {
		return s.OldestAge + time.Since(s.at)
	}
	return max(time.Since(s.Oldest), 0)
}

// due takes a batch: bounded by bytes too when the store can.
func (r *Relay) due(ctx context.Context) (Batch, error) {
	return r.store.Due(ctx, r.cfg.BatchSize, r.cfg.BatchBytes)
}

// result is one row's publish.
type result struct {
	i   int
	err error
}

// batch relays one batch; it returns how many rows it took, false when
// the store failed or no publish of a non-empty batch got through, and the
// earliest next attempt of the rows it failed (zero when none).
func (r *Relay) batch(ctx context.Context) (n int, ok bool, retry time.Time) {
	// The store's calls and the publishes run on a context of their own:
	// a Close in the middle of a batch finishes it.
	work := context.WithoutCancel(ctx)
	// The batch's life: a PostgreSQL batch's transaction ends with it.
	life, endLife := context.WithTimeout(work, r.cfg.PublishTimeout+3*r.cfg.StoreTimeout)
	defer endLife()
	b, err := storeCall(r, life, true, r.due,
		func(b Batch, err error) { // taken after all, for nobody
			if err == nil {
				_ = b.Release(life)
			}
		})
	if err != nil {
		if ctx.Err() == nil {
			r.failures.Add(work, 1, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(r.cfg.name), semconv.ErrorTypeKey.String("store"))))
			r.cfg.Logger.Error("The outbox relay could not read its rows", diag.RedactError(err), watermill.LogFields{"outbox": r.cfg.name})
		}
		return 0, false, time.Time{}
	}
	taken := time.Now()
	rows := b.Rows()
	if len(rows) == 0 || r.closingNow() {
		// Empty, or taken as Close was called: given back unpublished — a
		// batch is begun only before Close, and only that one is finished.
		_, _ = storeCall(r, life, true, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.Release(ctx) }, nil)
		return 0, true, time.Time{}
	}
	pctx, cancel := context.WithTimeout(life, r.cfg.PublishTimeout)
	defer cancel()
	results := r.publish(pctx, rows)
	errs := make([]error, len(rows))
	seen := make([]bool, len(rows))
	for range rows {
		select {
		case res := <-results:
			errs[res.i], seen[res.i] = res.err, true
		case <-pctx.Done():
		}
		if pctx.Err() != nil {
			break
		}
	}
	untried := r.isolate(pctx, rows, errs, seen)
	givenBack := make([]bool, len(rows))
	for _, i := range untried {
		givenBack[i] = true
	}
	now := time.Now()
	relayed := make([]int64, 0, len(rows))
	var failed []Failed
	var first error
	unreachable, died := false, 0
	for i, row := range rows {
		err := errs[i]
		if !seen[i] {
			err = fmt.Errorf("%w: the publish did not return within %s", sluice.ErrPublishUncertain, r.cfg.PublishTimeout)
		}
		if err == nil {
			relayed = append(relayed, row.ID)
			continue
		}
		first = cmp.Or(first, err)
		kind := errorType(err)
		r.failures.Add(work, 1, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(r.cfg.name),
			semconv.MessagingDestinationName(row.Topic), semconv.ErrorTypeKey.String(kind))))
		next, dead, uncounted := now, false, true
		switch {
		case kind == errorTypeUnreachable:
			unreachable = true
		case givenBack[i]:
			// Failed beside the culprit, and not tried alone: due again at
			// once, not on its retry schedule, where the culprit's own is
			// (the rows tried alone, the culprit among them once reached,
			// have their own outcome).
			err = fmt.Errorf("%w (not tried alone within PublishTimeout: given back)", err)
		default:
			next, uncounted = now.Add(r.retryAfter(row.Attempts)), false
			dead = row.Attempts+1 >= r.cfg.MaxAttempts
		}
		f := Failed{ID: row.ID, Err: diag.Bound(diag.Redact(err.Error()), errorMaxLength), NextAttempt: next, Dead: dead, Uncounted: uncounted}
		failed = append(failed, f)
		if dead {
			died++
			r.cfg.Logger.Error("An outbox row failed its last attempt: set aside as dead (sluice outbox list --dead)", nil,
				watermill.LogFields{"outbox": r.cfg.name, "row": row.ID, "topic": diag.Printable(row.Topic, 255), "attempts": row.Attempts + 1, "error": f.Err})
			continue
		}
		if retry.IsZero() || next.Before(retry) {
			retry = next
		}
	}
	_, err = storeCall(r, life, true, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.Finish(ctx, relayed, failed) }, nil)
	if err != nil {
		r.failures.Add(work, 1, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(r.cfg.name), semconv.ErrorTypeKey.String("store"))))
		r.cfg.Logger.Error("The outbox relay could not record its batch: its rows will be sent again", diag.RedactError(err),
			watermill.LogFields{"outbox": r.cfg.name, "rows": len(rows)})
		return 0, false, time.Time{}
	}
	// Counted once the delete committed: a batch whose delete failed is
	// sent again, and counted then.
	for i, row := range rows {
		if errs[i] != nil || !seen[i] {
			continue
		}
		r.relayed.Add(work, 1, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(r.cfg.name), semconv.MessagingDestinationName(row.Topic))))
		lag := time.Since(row.CreatedAt)
		if row.Age > 0 {
			lag = row.Age + now.Sub(taken) // one clock: see readStats.oldestAge
		}
		r.lag.Record(work, max(lag, 0).Seconds(), r.attrs)
	}
	for _, f := range failed {
		if f.Dead {
			r.deadLettered.Add(work, 1, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(r.cfg.name),
				semconv.MessagingDestinationName(rowTopic(rows, f.ID)))))
		}
	}
	if len(failed) > died {
		r.cfg.Logger.Error("Outbox rows could not be published: kept, tried again later", diag.RedactError(first),
			watermill.LogFields{"outbox": r.cfg.name, "failed": len(failed) - died, "rows": len(rows)})
	}
	// Rows refused one by one have their own next attempt: only a batch no
	// broker took at all makes the relay back off.
	n = len(rows)
	if b.CutShort() {
		n = r.cfg.BatchSize // more rows are due: take them at once
	}
	return n, len(relayed) > 0 || !unreachable, retry
}

// publish publishes rows on ctx and returns the channel of their results,
// buffered so that a publish that outlives the batch still returns: per
// topic, in order, topics at once — a PublishEach per topic when the
// publisher is a broker.EachPublisher (pipelined), else a Publish per row,
// one after another (the next row of a topic is sent once the one before
// returned: concurrent publishes would not keep the rows' order).
func (r *Relay) publish(ctx context.Context, rows []Row) <-chan result {
	results := make(chan result, len(rows))
	each, pipelined := r.publisher.(broker.EachPublisher)
	var topics []string
	byTopic := map[string][]int{}
	for i, row := range rows {
		switch {
		case row.Err != nil: // kept aside, not sent
			results <- result{i, fmt.Errorf("%w: %w", errUnreadable, row.Err)}
		default:
			if _, seen := byTopic[row.Topic]; !seen {
				topics = append(topics, row.Topic)
			}
			byTopic[row.Topic] = append(byTopic[row.Topic], i)
		}
	}
	for _, topic := range topics {
		idx := byTopic[topic]
		if !pipelined {
			go func() {
				for _, i := range idx {
					if ctx.Err() != nil {
						return // the rest count as not returned: uncertain, never sent
					}
					results <- result{i, r.publishOne(ctx, rows[i])}
				}
			}()
			continue
		}
		msgs := make([]*message.Message, len(idx))
		for k, i := range idx {
			msgs[k] = rows[i].Message.Copy()
			msgs[k].SetContext(ctx)
		}
		go func() {
			errs := each.PublishEach(topic, msgs...)
			for k, i := range idx {
				err := fmt.Errorf("outbox: the publisher reported %d outcomes for %d messages", len(errs), len(msgs))
				if k < len(errs) {
					err = errs[k]
				}
				results <- result{i, err}
			}
		}()
	}
	return results
}

// rowTopic is the topic of the row id of rows.
func rowTopic(rows []Row, id int64) string {
	for _, row := range rows {
		if row.ID == id {
			return row.Topic
		}
	}
	return ""
}

// isolate tries alone, within the batch's publish time, the rows of a
// batch in which several failed as refused or uncertain: a row the broker
// refuses by closing the channel (RabbitMQ's 406 for a message over its
// max_message_size, a CC header that is not an array) fails every row sent
// after it on that channel, other topics included. Alone, each good row
// goes through and the culprit fails with its own reason. The rows are
// tried one after another, in order: two at once would share a channel,
// and the culprit's close would fail the other. It returns the rows the
// publish time did not leave it to try, once it tried at least one: their
// failure may be the culprit's, not theirs (a slow broker answers a
// confirm at a time too slowly for 500 rows).
func (r *Relay) isolate(ctx context.Context, rows []Row, errs []error, seen []bool) (untried []int) {
	var suspects []int
	for i, err := range errs {
		if !seen[i] || err == nil || rows[i].Err != nil {
			continue
		}
		if k := errorType(err); k == errorTypeRefused || k == errorTypeUncertain {
			suspects = append(suspects, i)
		}
	}
	if len(suspects) < 2 {
		return nil
	}
	for n, i := range suspects {
		if ctx.Err() != nil {
			return untriedFrom(suspects, n)
		}
		one := make(chan error, 1) // a publish that outlives ctx still returns
		go func() { one <- r.publishOne(ctx, rows[i]) }()
		select {
		case errs[i] = <-one:
		case <-ctx.Done():
			return untriedFrom(suspects, n) // the rows not tried alone keep their first error
		}
	}
	return nil
}

// untriedFrom returns the suspects from the n-th on, the ones not tried
// alone, when the first n hold at least one: a batch whose isolation tried
// none gives none back, so that each batch settles a row at least.
func untriedFrom(suspects []int, n int) []int {
	if n == 0 {
		return nil
	}
	return suspects[n:]
}

// publishOne publishes row alone on ctx.
func (r *Relay) publishOne(ctx context.Context, row Row) error {
	msg := row.Message.Copy()
	msg.SetContext(ctx)
	if each, ok := r.publisher.(broker.EachPublisher); ok {
		if errs := each.PublishEach(row.Topic, msg); len(errs) == 1 {
			return errs[0]
		}
		return errors.New("outbox: the publisher reported no outcome for one message")
	}
	return r.publisher.Publish(row.Topic, msg)
}

// retryAfter is the wait before a row that failed attempts times before
// (and once more now) is tried again.
func (r *Relay) retryAfter(attempts int) time.Duration {
	d := r.cfg.RetryMin
	for range min(attempts, 32) {
		if d >= r.cfg.RetryMax/2 {
			return r.cfg.RetryMax
		}
		d *= 2
	}
	return min(d, r.cfg.RetryMax)
}

// errUnreadable marks a row the store could not read back as a message.
var errUnreadable = errors.New("outbox: the row cannot be read back as a message")

// errorType names a publish failure for metrics: unreachable (no broker to
// talk to: the row is tried again as soon as one answers), unpublishable
// (the message cannot be built for the wire), uncertain (sent, its confirm
// not seen: it may be stored), refused (nacked, returned as unroutable).
func errorType(err error) string {
	switch {
	case errors.Is(err, errUnreadable):
		return errorTypeUnreadable
	case sluice.Unreachable(err):
		return errorTypeUnreachable
	case errors.Is(err, sluice.ErrUnpublishable):
		return errorTypeUnpublishable
	case errors.Is(err, sluice.ErrPublishUncertain), errors.Is(err, context.DeadlineExceeded):
		return errorTypeUncertain
	}
	return errorTypeRefused
}

// storeCall runs one store call within StoreTimeout (internal/bounded, as
// the inbox's calls): a call its driver holds past it — lib/pq toward a
// black-holed server — is given up, as a *sluice.DependencyError, and goes
// on in the background, where late (if not nil) gets what it returns. With
// keep, f runs on ctx itself: a PostgreSQL batch's transaction is bound to
// the context it began on.
func storeCall[T any](r *Relay, ctx context.Context, keep bool, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	v, gaveUp, err := bounded.Run(r.calls, ctx, r.cfg.StoreTimeout, keep, f, late)
	if gaveUp {
		return v, &sluice.DependencyError{Op: "outbox: store", Err: err}
	}
	return v, err
}
