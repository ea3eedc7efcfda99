package sluicesql_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

// batchHandlerEnv is a batch handler on PostgreSQL or SQLite writing one
// row per event with one multi-row statement, and what it saw.
type batchHandlerEnv struct {
	*batchEnv // its database, tables, reader; no group commit stage
	spans     *tracetest.InMemoryExporter
	handle    message.HandlerFunc
	store     *sluicesql.Inbox
	cfg       deduplication.Config // StoreTimeout and ClaimTimeout, else defaults

	mu    sync.Mutex
	calls [][]string // the keys of each call
	// decide is each event's outcome (nil: done), before it is written.
	decide func(ctx context.Context, key string) error
}

func newBatchHandlerEnv(t *testing.T, backend string, bh deduplication.BatchHandler, tableSuffix string) *batchHandlerEnv {
	t.Helper()
	return newBatchHandlerEnvOf(t, backend, bh, tableSuffix, deduplication.Config{})
}

// newBatchHandlerEnvWith is newBatchHandlerEnv with the inbox's
// ClaimTimeout and StoreTimeout of cfg.
func newBatchHandlerEnvWith(t *testing.T, backend string, bh deduplication.BatchHandler, cfg deduplication.Config) *batchHandlerEnv {
	t.Helper()
	return newBatchHandlerEnvOf(t, backend, bh, "", cfg)
}

func newBatchHandlerEnvOf(t *testing.T, backend string, bh deduplication.BatchHandler, tableSuffix string, cfg deduplication.Config) *batchHandlerEnv {
	t.Helper()
	e := &batchHandlerEnv{batchEnv: &batchEnv{reader: sdkmetric.NewManualReader()}, spans: tracetest.NewInMemoryExporter(), cfg: cfg}
	prefix := ""
	switch backend {
	case "postgres", "pgx":
		e.db = testenv.Postgres(t)
		prefix = testenv.Schema(t, e.db) + "."
	default:
		e.db = testenv.SQLite(t)
	}
	e.table, e.inbox = prefix+"projection", prefix+"inbox"
	_, err := e.db.Exec(`CREATE TABLE ` + e.table + ` (k TEXT NOT NULL` + tableSuffix + `)`)
	require.NoError(t, err)
	e.store = testenv.SQLStore(t, e.db, e.inbox)
	store := e.store
	if backend == "pgx" {
		// lib/pq taken for pgx: the store's statements as on pgx (one
		// statement a round trip, its values as parameters).
		store, err = sluicesql.NewInbox(sqlx.NewDb(e.db.DB, "pgx"), sluicesql.InboxConfig{Table: e.inbox})
		require.NoError(t, err)
	}
	bh.Handle = e.project
	e.handle, err = deduplication.NewBatchHandler(deduplication.Config{Store: store, Consumer: "c",
		Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader)), StoreTimeout: e.cfg.StoreTimeout,
			TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(e.spans))}, ClaimTimeout: e.cfg.ClaimTimeout}, bh)
	require.NoError(t, err)
	return e
}

// project is the batch handler: the events decided done or rejected are
// written in one INSERT.
func (e *batchHandlerEnv) project(ctx context.Context, msgs []*message.Message) []error {
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Metadata.Get(sluice.EventIDKey)
	}
	e.mu.Lock()
	e.calls = append(e.calls, keys)
	decide := e.decide
	e.mu.Unlock()
	out := make([]error, len(msgs))
	var write []string
	for i, k := range keys {
		if decide != nil {
			out[i] = decide(ctx, k)
		}
		if out[i] == nil || errors.Is(out[i], errRejectedWrites) {
			write = append(write, k)
		}
	}
	if len(write) == 0 {
		return out
	}
	tx := sluicesql.TxFromContext(ctx)
	q := `INSERT INTO ` + e.table + ` (k) VALUES ` + strings.TrimSuffix(strings.Repeat("(?),", len(write)), ",")
	args := make([]any, len(write))
	for i, k := range write {
		args[i] = k
	}
	if _, err := tx.ExecContext(ctx, tx.Rebind(q), args...); err != nil {
		if decide == nil {
			return deduplication.SameOutcome(msgs, err)
		}
		for i := range out {
			if out[i] == nil {
				out[i] = err
			}
		}
	}
	return out
}

var errRejectedWrites = errors.New("rejected, its row written")

func (e *batchHandlerEnv) callKeys() [][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][]string(nil), e.calls...)
}

func (e *batchHandlerEnv) deliverCtx(ctx context.Context, key string) error {
	msg := message.NewMessage(key, nil)
	msg.Metadata.Set(sluice.EventIDKey, key)
	msg.SetContext(ctx)
	_, err := e.handle(msg)
	return err
}

func (e *batchHandlerEnv) deliverAll(keys ...string) []error {
	fs := make([]func() error, len(keys))
	for i, k := range keys {
		fs[i] = func() error { return e.deliverCtx(context.Background(), k) }
	}
	return together(fs...)
}

func (e *batchHandlerEnv) claimed(t *testing.T) []string {
	t.Helper()
	var ks []string
	require.NoError(t, e.db.Select(&ks, `SELECT event_key FROM `+e.inbox+` ORDER BY event_key`))
	return ks
}

func keysN(prefix string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return ks
}

// A batch fills (MaxBatch) long before its MaxWait: one handler call, one
// claim statement and one commit for the 32 events, each row once; the
// batch has one span ("sluice.batch"); the size histogram says 32.
func TestABatchHandlerCommitsABatchInOneCall(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			e := newBatchHandlerEnv(t, backend, deduplication.BatchHandler{MaxBatch: 32, MaxWait: time.Second}, "")
			keys := keysN("k", 32)
			for _, err := range e.deliverAll(keys...) {
				require.NoError(t, err)
			}
			// One call, one batch of 32 — unless 100 ms (a tenth of
			// MaxWait) passed between two of the deliveries sent together,
			// which closes the gathering: seen once on a loaded machine in
			// make test (a batch of 1, then 31). Either way each event is
			// in one call, and each call is one batch: one span, one size.
			calls := e.callKeys()
			assert.ElementsMatch(t, keys, slices.Concat(calls...))
			assert.ElementsMatch(t, keys, e.rows(t))
			assert.ElementsMatch(t, keys, e.claimed(t))
			count, largest := e.batchSizes(t)
			assert.Equal(t, uint64(len(calls)), count)
			most := 0
			for _, c := range calls {
				most = max(most, len(c))
			}
			assert.Equal(t, int64(most), largest)
			spans := e.spans.GetSpans()
			require.Len(t, spans, len(calls))
			assert.Equal(t, "sluice.batch", spans[0].Name)
			if len(calls) > 1 {
				t.Logf("the deliveries sent together came in %d batches: %v", len(calls), calls)
			}

			// Delivered again: duplicates, the handler not called.
			for _, err := range e.deliverAll(keys...) {
				require.NoError(t, err)
			}
			assert.Len(t, e.callKeys(), len(calls))
			assert.Len(t, e.rows(t), 32)
		})
	}
}

// Once every delivery the handler can be handed at once (InFlight) is in
// it, no other can come before one is acked: the batch gathering closes at
// once, without waiting a tenth of its MaxWait for a quiet moment. Thirteen
// deliveries at once with InFlight 12 and MaxBatch 64: never one call of
// all thirteen (a batch closes as the twelfth is in), each event written
// once. Before, the thirteen waited together for 100 ms of quiet (MaxWait
// 1 s) and made one call — with a consumer's whole prefetch in the handler,
// a batch waited for deliveries that could not come.
func TestABatchClosesOnceEveryDeliveryInFlightIsIn(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 64, MaxWait: time.Second, InFlight: 12}, "")
	keys := keysN("k", 13)
	for _, err := range e.deliverAll(keys...) {
		require.NoError(t, err)
	}
	calls := e.callKeys()
	require.Greater(t, len(calls), 1, "a batch closed as the twelfth delivery came in: %v", calls)
	for _, c := range calls {
		require.LessOrEqual(t, len(c), 12, "no batch holds more than the deliveries in flight: %v", calls)
	}
	assert.ElementsMatch(t, keys, e.rows(t))
}

func TestBatchHandlerInFlightMustNotBeNegative(t *testing.T) {
	t.Parallel()
	_, err := deduplication.NewBatchHandler(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"},
		deduplication.BatchHandler{Handle: func(context.Context, []*message.Message) []error { return nil }, InFlight: -1})
	require.ErrorContains(t, err, "BatchHandler.InFlight must not be negative, got -1")
}

// Eight copies of one event in a batch, beside other events: the handler
// sees it once, every copy is acked, one row.
func TestABatchHandlerSeesEightCopiesOfAnEventOnce(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 16, MaxWait: time.Second}, " PRIMARY KEY")
	keys := append(keysN("other", 8), "same", "same", "same", "same", "same", "same", "same", "same")
	for _, err := range e.deliverAll(keys...) {
		require.NoError(t, err)
	}
	// The handler sees "same" once, in one call: one batch unless a
	// 100 ms gap between two deliveries sent together (a loaded machine)
	// closed the gathering early.
	calls := slices.Concat(e.callKeys()...)
	assert.Len(t, calls, 9)
	assert.ElementsMatch(t, append(keysN("other", 8), "same"), calls)
	assert.Len(t, e.rows(t), 9)
}

// Mixed outcomes in one batch: the Transient and the Poison event leave
// it (no claim, no row) with their own errors; the rejected event commits
// with the rest; the handler ran twice (the second time without them).
func TestABatchHandlersFailedEventsLeaveTheBatch(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 10, MaxWait: time.Second}, "")
	transient, poisonous := errors.New("dependency blip"), errors.New("unreadable")
	e.decide = func(_ context.Context, k string) error {
		switch k {
		case "k03":
			return sluice.Transient(transient)
		case "k05":
			return sluice.Poison(poisonous)
		case "k07":
			return sluice.Reject(errRejectedWrites)
		}
		return nil
	}
	keys := keysN("k", 10)
	errs := e.deliverAll(keys...)
	for i, err := range errs {
		switch keys[i] {
		case "k03":
			assert.ErrorIs(t, err, transient)
			assert.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))
		case "k05":
			assert.ErrorIs(t, err, poisonous)
			assert.Equal(t, sluice.ClassPoison, sluice.ClassOf(err))
		case "k07":
			assert.Equal(t, sluice.ClassRejected, sluice.ClassOf(err))
		default:
			assert.NoError(t, err, keys[i])
		}
	}
	want := []string{"k00", "k01", "k02", "k04", "k06", "k07", "k08", "k09"}
	assert.Equal(t, want, e.rows(t))
	assert.Equal(t, want, e.claimed(t))
	// The handler ran the batch, then again without the two that left:
	// two calls of 10 and 8 — or, when 100 ms between two deliveries sent
	// together closed the gathering early (a loaded machine), as many more
	// as the batches they came in. Either way the leavers are in one call
	// each, and every other event's last call holds neither.
	calls := e.callKeys()
	require.GreaterOrEqual(t, len(calls), 2, "%v", calls)
	seen, last := map[string]int{}, map[string]int{}
	for i, c := range calls {
		for _, k := range c {
			seen[k]++
			last[k] = i
		}
	}
	assert.Equal(t, 1, seen["k03"], "%v", calls)
	assert.Equal(t, 1, seen["k05"], "%v", calls)
	for _, k := range want {
		assert.NotContains(t, calls[last[k]], "k03", "%s committed in a call without the leavers: %v", k, calls)
		assert.NotContains(t, calls[last[k]], "k05", "%s committed in a call without the leavers: %v", k, calls)
	}
}

// A panic is narrowed down by halving: the one event that panics fails as
// Invariant with the PanicError, every other one commits.
func TestABatchHandlersPanicFailsOnlyThePanickingEvent(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 16, MaxWait: time.Second}, "")
	e.decide = func(_ context.Context, k string) error {
		if k == "k11" {
			panic("boom")
		}
		return nil
	}
	keys := keysN("k", 16)
	errs := e.deliverAll(keys...)
	for i, err := range errs {
		if keys[i] != "k11" {
			assert.NoError(t, err, keys[i])
			continue
		}
		var p *sluice.PanicError
		require.ErrorAs(t, err, &p)
		assert.Equal(t, "boom", p.Value)
		assert.Equal(t, sluice.ClassInvariant, sluice.ClassOf(err))
	}
	assert.Len(t, e.rows(t), 15)
	assert.NotContains(t, e.claimed(t), "k11")
	// Halving 16 down to one: 1 + 2·log2(16) calls at most.
	assert.LessOrEqual(t, len(e.callKeys()), 9)
}

// A COMMIT that fails for one event (a deferred unique constraint it
// violates) fails that event alone: the batch is halved until the rest
// commit without it.
func TestABatchHandlersFailedCommitFailsOnlyTheEventThatFailedIt(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 8, MaxWait: time.Second},
		" UNIQUE DEFERRABLE INITIALLY DEFERRED")
	_, err := e.db.Exec(`INSERT INTO ` + e.table + ` (k) VALUES ('k06')`) // taken before
	require.NoError(t, err)
	keys := keysN("k", 8)
	errs := e.deliverAll(keys...)
	for i, err := range errs {
		if keys[i] == "k06" {
			assert.Equal(t, sluice.ClassTransient, sluice.ClassOf(err), "%v", err)
			continue
		}
		assert.NoError(t, err, keys[i])
	}
	assert.Equal(t, keys, e.rows(t)) // k06 once: the row from before
	assert.NotContains(t, e.claimed(t), "k06")
	assert.Len(t, e.claimed(t), 7)
}

// A delivery whose context ends (the shutdown grace ran out) while its
// batch still gathers leaves it unprocessed; a running batch whose context
// ended before its statements did rolls back whole, its deliveries back
// unprocessed; one that finishes in time commits.
func TestABatchHandlerAtShutdown(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 4, MaxWait: time.Second, Concurrency: 1}, "")
	running, finish := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.decide = func(context.Context, string) error {
		once.Do(func() { close(running) })
		<-finish
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := keysN("run", 4)
	results := make(chan error, 4)
	for _, k := range first {
		go func() { results <- e.deliverCtx(ctx, k) }()
	}
	<-running // the first batch runs; the next one gathers
	gathering := make(chan error, 1)
	go func() { gathering <- e.deliverCtx(ctx, "gathering") }()
	cancel()
	err := <-gathering
	require.Error(t, err)
	assert.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))
	assert.ErrorIs(t, err, context.Canceled)
	close(finish)
	// The running batch's context ended with its deliveries': its INSERT
	// fails, it rolls back, and each of its deliveries goes back
	// unprocessed (Transient, which Classify makes sluice.ErrShutdown
	// behind the ShutdownGrace stage): nothing half done.
	for range first {
		err := <-results
		assert.ErrorIs(t, err, context.Canceled)
	}
	assert.Empty(t, e.rows(t))
	assert.Empty(t, e.claimed(t))

	// What finishes within its deliveries' contexts commits (the grace).
	e.decide = nil
	for _, err := range e.deliverAll(first...) {
		assert.NoError(t, err)
	}
	assert.Equal(t, first, e.rows(t))
}

// The handler's context ends with the first delivery's deadline: a handler
// that waits for it fails the batch's events as Transient, nothing
// committed.
func TestABatchHandlersContextEndsWithTheDeliveriesDeadline(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 3, MaxWait: time.Second}, "")
	e.decide = func(ctx context.Context, _ string) error {
		select {
		case <-ctx.Done():
			return sluice.Transient(context.Cause(ctx))
		case <-time.After(time.Minute):
			return errors.New("the handler's context did not end with the delivery's deadline")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	fs := make([]func() error, 3)
	for i, k := range keysN("k", 3) {
		c := context.Background()
		if i == 1 {
			c = ctx
		}
		fs[i] = func() error { return e.deliverCtx(c, k) }
	}
	for _, err := range together(fs...) {
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))
	}
	assert.Empty(t, e.rows(t))
	assert.Empty(t, e.claimed(t))
}

// One event's row violates a CHECK constraint, failing the batch's one
// INSERT for every event (one error, Poison: SQLSTATE 23): the batch is
// halved until that event is found; it alone is poisoned, the others commit.
func TestABatchHandlersStatementFailingForOneEventFailsOnlyThatEvent(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 16, MaxWait: time.Second}, " CHECK (k <> 'k09')")
	keys := keysN("k", 16)
	errs := e.deliverAll(keys...)
	for i, err := range errs {
		if keys[i] == "k09" {
			assert.Equal(t, sluice.ClassPoison, sluice.DefaultClassifier().Classify(err), "%v", err)
			continue
		}
		assert.NoError(t, err, keys[i])
	}
	assert.Len(t, e.rows(t), 15)
	assert.NotContains(t, e.claimed(t), "k09")
}

// The batch's span links the span of each of its deliveries.
func TestABatchHandlersSpanLinksEachDelivery(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnv(t, "postgres", deduplication.BatchHandler{MaxBatch: 4, MaxWait: time.Second}, "")
	keys := keysN("k", 4)
	want := make([]trace.SpanContext, len(keys))
	fs := make([]func() error, len(keys))
	for i, k := range keys {
		want[i] = trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, byte(i + 1)}, SpanID: trace.SpanID{2, byte(i + 1)}, TraceFlags: trace.FlagsSampled})
		ctx := trace.ContextWithSpanContext(context.Background(), want[i])
		fs[i] = func() error { return e.deliverCtx(ctx, k) }
	}
	for _, err := range together(fs...) {
		require.NoError(t, err)
	}
	spans := e.spans.GetSpans()
	require.Len(t, spans, 1)
	var got []trace.SpanContext
	for _, l := range spans[0].Links {
		got = append(got, l.SpanContext)
	}
	assert.ElementsMatch(t, want, got)
}

// holdClaim claims key in a transaction of its own and leaves it open, as
// a copy of the event in another batch does until its commit: end it with
// the returned function (commit or not).
func (e *batchHandlerEnv) holdClaim(t *testing.T, key string) func(commit bool) {
	t.Helper()
	// Not t.Context(): it ends just before t's cleanups run, and
	// database/sql then rolls the transaction back by itself, racing the
	// cleanup's Rollback ("driver: bad connection" in a fresh-clone make
	// test at 508fe73).
	tx, err := e.store.Begin(context.Background())
	require.NoError(t, err)
	claimed, err := tx.Claim(context.Background(), "c", key)
	require.NoError(t, err)
	require.True(t, claimed)
	ended := false
	end := func(commit bool) {
		if ended {
			return
		}
		ended = true
		if commit {
			require.NoError(t, tx.Commit(context.Background()))
			return
		}
		require.NoError(t, tx.Rollback(context.Background()))
	}
	t.Cleanup(func() { end(false) })
	return end
}

// A key of the batch that another open transaction holds (a copy of the
// event in another batch, not committed yet) no longer stalls the batch
// for ClaimTimeout + StoreTimeout: the batch's claim waits 1 ms for it
// (lock_timeout), then the keys are claimed again by halves, and the
// delivery of the held key leaves the batch to wait for it alone. The rest
// commit while the key is still held; once its holder commits, that
// delivery is a duplicate. Before, the batch's claim waited for the key,
// and with the holder open past 15 s every event of the batch failed as
// Transient.
func TestABatchHandlersClaimDoesNotWaitForAKeyHeldElsewhere(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "pgx"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			e := newBatchHandlerEnv(t, backend, deduplication.BatchHandler{MaxBatch: 8, MaxWait: time.Second}, "")
			end := e.holdClaim(t, "k05")
			keys := keysN("k", 8)
			type result struct {
				key string
				err error
			}
			results := make(chan result, len(keys))
			for _, k := range keys {
				go func() { results <- result{k, e.deliverCtx(context.Background(), k)} }()
			}
			for range len(keys) - 1 { // every one but k05, while k05 is held
				select {
				case r := <-results:
					require.NotEqual(t, "k05", r.key, "k05 returned while its key was held: %v", r.err)
					require.NoError(t, r.err, r.key)
				case <-time.After(2 * time.Minute): // a liveness bound: a batch that waits for the held key fails every event as Transient after ClaimTimeout (the NoError above), while the key is still held
					t.Fatal("the batch waited for the held key")
				}
			}
			assert.Equal(t, []string{"k00", "k01", "k02", "k03", "k04", "k06", "k07"}, e.rows(t))
			end(true) // the holder commits k05 (its effect, elsewhere)
			select {
			case r := <-results:
				assert.Equal(t, "k05", r.key)
				assert.NoError(t, r.err, "a duplicate once its holder committed")
			case <-time.After(time.Minute):
				t.Fatal("k05 did not return after its holder committed")
			}
			for _, call := range e.callKeys() {
				assert.NotContains(t, call, "k05", "the handler never saw the held key")
			}
			assert.Len(t, e.rows(t), 7)
		})
	}
}

// A delivery whose key stays held past ClaimTimeout fails as Transient
// matching ErrClaimInProgress (to a retry tier), as without a batch; the
// held key is given back when its holder rolls back.
func TestABatchHandlersHeldKeyWaitsClaimTimeoutAlone(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnvWith(t, "postgres", deduplication.BatchHandler{MaxBatch: 4, MaxWait: time.Second},
		deduplication.Config{ClaimTimeout: 300 * time.Millisecond})
	e.holdClaim(t, "k02")
	keys := keysN("k", 4)
	errs := e.deliverAll(keys...)
	for i, err := range errs {
		if keys[i] == "k02" {
			require.ErrorIs(t, err, deduplication.ErrClaimInProgress)
			assert.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))
			continue
		}
		assert.NoError(t, err, keys[i])
	}
	assert.Equal(t, []string{"k00", "k01", "k03"}, e.rows(t))
}

// With a negative ClaimTimeout ("no bound but the message context's"), a
// delivery whose key another open unit of work holds waits for it alone as
// long as its own context lasts, as it does without a batch: StoreTimeout
// does not bound that wait, and the end of the delivery's context is not
// the store's failure. Before, its claim ran on a context of its own,
// given up after StoreTimeout as a *sluice.DependencyError the brake
// counts as an outage (or, with a negative StoreTimeout too, waiting past
// the delivery's deadline for as long as the key was held). The claim is
// seen waiting for the lock past StoreTimeout (pg_stat_activity), then the
// delivery's context is cancelled.
func TestABatchHandlersHeldKeyWithoutAClaimTimeoutWaitsAsLongAsItsDelivery(t *testing.T) {
	t.Parallel()
	const storeTimeout = 2 * time.Second
	for _, backend := range []string{"postgres", "pgx"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			e := newBatchHandlerEnvWith(t, backend, deduplication.BatchHandler{MaxBatch: 2, MaxWait: time.Second},
				deduplication.Config{ClaimTimeout: -1, Env: sluice.Env{StoreTimeout: storeTimeout}})
			e.holdClaim(t, "k01") // held until the test ends
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			k00, k01 := make(chan error, 1), make(chan error, 1)
			go func() { k00 <- e.deliverCtx(context.Background(), "k00") }()
			go func() { k01 <- e.deliverCtx(ctx, "k01") }()
			require.NoError(t, <-k00)

			// k01 waits alone for its key, past StoreTimeout.
			testenv.AwaitLockWait(t, e.db, strings.TrimSuffix(e.inbox, ".inbox"), storeTimeout+time.Second, k01)
			cancel()
			select {
			case err := <-k01:
				require.Error(t, err)
				var dep *sluice.DependencyError
				assert.False(t, errors.As(err, &dep), "the delivery's context ended, not the store: %v", err)
			case <-time.After(time.Minute): // a liveness bound: the claim ends with the context
				t.Fatal("k01 still in its claim a minute after its context ended")
			}
			assert.Equal(t, []string{"k00"}, e.rows(t))
		})
	}
}

// Issue 46 (item 3): the batch's transaction bounds its idle time as the
// inbox's does (IdleBounder) when a delivery has a deadline: a handler that
// hangs past the first deadline, StoreTimeout and a second no longer holds
// its batch's keys — PostgreSQL ends the session and another transaction
// claims them. Before, nothing bounded it: the other claim waited as long
// as the handler hung.
func TestABatchHandlersIdleTransactionIsEnded(t *testing.T) {
	t.Parallel()
	e := newBatchHandlerEnvWith(t, "postgres", deduplication.BatchHandler{MaxBatch: 2, MaxWait: time.Second},
		deduplication.Config{Env: sluice.Env{StoreTimeout: 200 * time.Millisecond}})
	hung, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var setting string
	e.decide = func(ctx context.Context, _ string) error {
		once.Do(func() {
			_ = sluicesql.TxFromContext(ctx).GetContext(ctx, &setting, `SHOW idle_in_transaction_session_timeout`)
			close(hung)
		})
		<-release // hung, deaf to its context
		return nil
	}
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	results := make(chan error, 2)
	for _, k := range []string{"k0", "k1"} {
		go func() { results <- e.deliverCtx(ctx, k) }()
	}
	<-hung
	assert.NotEqual(t, "0", setting, "the batch's transaction has an idle bound")
	// The next claim of k0 waits for the hung batch, and gets the key once
	// PostgreSQL ends its session (0.3 s + 0.2 s + 1 s idle).
	claimCtx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	next, err := e.store.Begin(claimCtx)
	require.NoError(t, err)
	defer func() { _ = next.Rollback(context.Background()) }()
	claimed, err := next.Claim(claimCtx, "c", "k0")
	require.NoError(t, err, "the hung batch's transaction was not ended")
	assert.True(t, claimed, "the hung batch's claim was rolled back with its session")
}
