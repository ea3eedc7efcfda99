package sluicesql_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

// batchEnv is an inbox with group commit on PostgreSQL or SQLite, and a
// business table of the test's own.
type batchEnv struct {
	db     *sqlx.DB
	table  string // the business table, qualified
	inbox  string
	stage  message.HandlerMiddleware
	store  *sluicesql.Inbox
	reader *sdkmetric.ManualReader
}

func newBatchEnv(t *testing.T, backend string, batch deduplication.BatchConfig, unique bool) *batchEnv {
	t.Helper()
	return newBatchEnvWith(t, backend, batch, unique, sluice.Env{})
}

// newBatchEnvWith is newBatchEnv with the inbox's env (its MeterProvider
// the test's).
func newBatchEnvWith(t *testing.T, backend string, batch deduplication.BatchConfig, unique bool, env sluice.Env) *batchEnv {
	t.Helper()
	e := &batchEnv{reader: sdkmetric.NewManualReader()}
	prefix := ""
	switch backend {
	case "postgres":
		e.db = testenv.Postgres(t)
		prefix = testenv.Schema(t, e.db) + "."
	default:
		e.db = testenv.SQLite(t)
	}
	e.table, e.inbox = prefix+"effects", prefix+"inbox"
	constraint := ""
	if unique {
		constraint = " PRIMARY KEY"
	}
	_, err := e.db.Exec(`CREATE TABLE ` + e.table + ` (k TEXT NOT NULL` + constraint + `)`)
	require.NoError(t, err)
	store := testenv.SQLStore(t, e.db, e.inbox)
	e.store = store
	env.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	e.stage, err = deduplication.New(deduplication.Config{Store: store, Consumer: "c", Batch: &batch, Env: env})
	require.NoError(t, err)
	return e
}

// deliver runs one delivery of key through the stage.
func (e *batchEnv) deliver(key string, h func(ctx context.Context, tx *sqlx.Tx) error) error {
	return e.deliverOn(context.Background(), key, h)
}

// deliverOn runs one delivery of key, on ctx, through the stage.
func (e *batchEnv) deliverOn(ctx context.Context, key string, h func(ctx context.Context, tx *sqlx.Tx) error) error {
	msg := message.NewMessage(key, nil)
	msg.Metadata.Set(sluice.EventIDKey, key)
	msg.SetContext(ctx)
	_, err := e.stage(func(msg *message.Message) ([]*message.Message, error) {
		return nil, h(msg.Context(), sluicesql.TxFromContext(msg.Context()))
	})(msg)
	return err
}

func (e *batchEnv) insert(ctx context.Context, tx *sqlx.Tx, k string) error {
	_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO `+e.table+` (k) VALUES (?)`), k)
	return err
}

func (e *batchEnv) rows(t *testing.T) []string {
	t.Helper()
	var ks []string
	require.NoError(t, e.db.Select(&ks, `SELECT k FROM `+e.table+` ORDER BY k`))
	return ks
}

func (e *batchEnv) claims(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.Get(&n, `SELECT count(*) FROM `+e.inbox))
	return n
}

// batchSizes returns how many group commits were recorded and the
// largest.
func (e *batchEnv) batchSizes(t *testing.T) (count uint64, largest int64) {
	t.Helper()
	return testenv.Histogram(t, e.reader, telemetry.MetricInboxBatchSize)
}

// together runs the deliveries at once and returns their errors in order.
func together(fs ...func() error) []error {
	errs := make([]error, len(fs))
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Go(func() { errs[i] = f() })
	}
	wg.Wait()
	return errs
}

// Issue 22: 8 consumers × 1,000 deliveries of the same 1,000 keys, with
// group commit → exactly 1,000 business rows, and batches of more than one.
func TestGroupCommitDoesEachKeyOnce(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			// Linger: a batch waits (up to 100 ms) for 8 deliveries, so
			// that batches of more than one do not hang on the scheduler
			// (on a loaded machine the default's batches were all of one).
			// Not longer: a batch whose one delivery gave up lingers that
			// long after the test, and goleak would see it.
			e := newBatchEnv(t, backend, deduplication.BatchConfig{MaxBatch: 8, MaxWait: 100 * time.Millisecond, Linger: true}, false)
			const consumers = 8
			keys := 1000
			if backend == "sqlite" { // one writer at a time: fewer, to keep the run short
				keys = 300
			}
			var wg sync.WaitGroup
			errs := make(chan error, keys*consumers)
			for c := range consumers {
				for lane := range 4 { // each consumer keeps deliveries in flight
					wg.Go(func() {
						for k := lane; k < keys; k += 4 {
							key := fmt.Sprint("k-", (k+c*97)%keys)
							for {
								err := e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, key) })
								if err == nil {
									break
								}
								if sluice.DefaultClassifier().Classify(err) != sluice.ClassTransient {
									errs <- err
									return
								}
							}
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			got := e.rows(t)
			require.Len(t, got, keys)
			seen := map[string]bool{}
			for _, k := range got {
				require.False(t, seen[k], "%s done twice", k)
				seen[k] = true
			}
			require.Equal(t, keys, e.claims(t))
			n, largest := e.batchSizes(t)
			require.Positive(t, n)
			require.Greater(t, largest, int64(1), "deliveries shared commits")
		})
	}
}

// A failing handler in the middle of a batch rolls back to its savepoint:
// its claim and writes vanish, its error goes out at once; the others
// commit. A panic does the same and unwinds.
func TestGroupCommitAFailureInTheMiddleRollsBackAlone(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			// The batch closes when full: all four in it.
			e := newBatchEnv(t, backend, deduplication.BatchConfig{MaxBatch: 4, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false)
			ok := func(key string) func() error {
				return func() error {
					return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, key) })
				}
			}
			boom := errors.New("the stock service timed out")
			errs := together(ok("a"),
				func() error {
					return e.deliver("fails", func(ctx context.Context, tx *sqlx.Tx) error {
						if err := e.insert(ctx, tx, "fails"); err != nil {
							return err
						}
						return sluice.Transient(boom)
					})
				},
				func() (err error) {
					defer func() {
						if r := recover(); r != nil {
							err = fmt.Errorf("panicked: %v", r)
						}
					}()
					return e.deliver("panics", func(ctx context.Context, tx *sqlx.Tx) error {
						if err := e.insert(ctx, tx, "panics"); err != nil {
							return err
						}
						panic("a nil map")
					})
				},
				ok("b"))
			require.NoError(t, errs[0])
			require.ErrorIs(t, errs[1], boom)
			require.ErrorContains(t, errs[2], "panicked: a nil map")
			require.NoError(t, errs[3])
			require.Equal(t, []string{"a", "b"}, e.rows(t))
			require.Equal(t, 2, e.claims(t))
			n, largest := e.batchSizes(t)
			require.Equal(t, uint64(1), n, "one commit")
			require.Equal(t, int64(2), largest, "of the two that kept their writes")

			// The failed ones are not recorded: they run again.
			require.NoError(t, ok("fails")())
			require.Equal(t, []string{"a", "b", "fails"}, e.rows(t))
		})
	}
}

// A delivery whose deadline passed in its handler (Watermill's Timeout)
// fails alone: its savepoint is rolled back on a context of the batch's,
// not its own, and its batch mate commits, its handler run once — with
// StoreTimeout's bound and without one. Before, with StoreTimeout negative
// the rollback to its savepoint ran on its ended context, failed before it
// reached the database, and broke the batch: its mate ran again alone.
func TestGroupCommitADeliveryWhoseDeadlinePassedSpoilsNoBatch(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		for _, storeTimeout := range []time.Duration{0, -1} {
			t.Run(fmt.Sprintf("%s/StoreTimeout=%v", backend, storeTimeout), func(t *testing.T) {
				t.Parallel()
				// The batch closes when full: both in it.
				e := newBatchEnvWith(t, backend, deduplication.BatchConfig{MaxBatch: 2, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false,
					sluice.Env{StoreTimeout: storeTimeout})
				var runs atomic.Int64
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				errs := together(
					func() error {
						return e.deliver("a", func(ctx context.Context, tx *sqlx.Tx) error {
							runs.Add(1)
							return e.insert(ctx, tx, "a")
						})
					},
					func() error {
						return e.deliverOn(ctx, "late", func(hctx context.Context, tx *sqlx.Tx) error {
							if err := e.insert(hctx, tx, "late"); err != nil {
								return err
							}
							cancel() // its deadline passes
							return sluice.Transient(context.Cause(ctx))
						})
					})
				require.NoError(t, errs[0])
				require.ErrorIs(t, errs[1], context.Canceled)
				require.Equal(t, []string{"a"}, e.rows(t))
				require.EqualValues(t, 1, runs.Load(), "a's handler ran once")
			})
		}
	}
}

// The same key twice in one batch: the second does not claim over the
// first's uncommitted claim; it waits for the batch's commit and is then
// a duplicate (or, had the first rolled back, processed).
func TestGroupCommitRecognisesTheSameKeyTwiceInABatch(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			e := newBatchEnv(t, backend, deduplication.BatchConfig{MaxBatch: 3, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false)
			var mu sync.Mutex
			ran := 0
			h := func(ctx context.Context, tx *sqlx.Tx) error {
				mu.Lock()
				ran++
				mu.Unlock()
				return e.insert(ctx, tx, "same")
			}
			errs := together(
				func() error { return e.deliver("same", h) },
				func() error { return e.deliver("same", h) },
				func() error { return e.deliver("other", func(context.Context, *sqlx.Tx) error { return nil }) })
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, 1, ran)
			require.Equal(t, []string{"same"}, e.rows(t))
		})
	}
}

// A rejection after a statement that aborted the PostgreSQL transaction
// (a unique violation) rolls back to its savepoint and records its claim
// alone, in the same batch; the others commit.
func TestGroupCommitARejectionAfterAnAbortKeepsItsClaim(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: 3, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, true)
	_, err := e.db.Exec(`INSERT INTO ` + e.table + ` (k) VALUES ('taken')`)
	require.NoError(t, err)
	ok := func(key string) func() error {
		return func() error {
			return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, key) })
		}
	}
	errs := together(ok("a"), func() error {
		return e.deliver("rejected", func(ctx context.Context, tx *sqlx.Tx) error {
			err := e.insert(ctx, tx, "taken")
			require.Error(t, err)
			return sluice.Reject(err)
		})
	}, ok("b"))
	require.NoError(t, errs[0])
	require.Equal(t, sluice.ClassRejected, sluice.DefaultClassifier().Classify(errs[1]))
	require.NoError(t, errs[2])
	require.Equal(t, []string{"a", "b", "taken"}, e.rows(t))
	require.Equal(t, 3, e.claims(t), "the rejection's claim is recorded: a redelivery is a duplicate")
}

// A COMMIT that fails (a deferred constraint violated at commit) is the
// batch's: every delivery that waited for it runs again alone, at once,
// and only the one whose own write fails its commit fails (as Transient),
// with nothing recorded for it. Before, both failed and spent an attempt.
func TestGroupCommitAFailedCommitRunsItsDeliveriesAgainAlone(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: 2, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false)
	_, err := e.db.Exec(`ALTER TABLE ` + e.table + ` ADD CONSTRAINT once UNIQUE (k) DEFERRABLE INITIALLY DEFERRED`)
	require.NoError(t, err)
	same := func(key string) func() error {
		return func() error {
			return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, "clash") })
		}
	}
	var failed []error
	for _, err := range together(same("a"), same("b")) {
		if err != nil {
			failed = append(failed, err)
		}
	}
	require.Len(t, failed, 1, "one committed alone; the other's own write fails its own commit")
	require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(failed[0]), "%v", failed[0])
	require.ErrorContains(t, failed[0], "commit")
	require.Equal(t, []string{"clash"}, e.rows(t))
	require.Equal(t, 1, e.claims(t))
}

// The batch's PostgreSQL backend terminated in the middle of a batch, and
// in its COMMIT: nothing is reported done that was not committed.
func TestGroupCommitATerminatedBackendCommitsNothing(t *testing.T) {
	t.Parallel()
	terminate := func(t *testing.T, e *batchEnv, pid int) {
		t.Helper()
		var ok bool
		require.NoError(t, e.db.Get(&ok, `SELECT pg_terminate_backend($1)`, pid))
		require.True(t, ok)
	}
	backendPID := func(ctx context.Context, tx *sqlx.Tx) int {
		var pid int
		require.NoError(t, tx.GetContext(ctx, &pid, `SELECT pg_backend_pid()`))
		return pid
	}
	t.Run("mid-batch", func(t *testing.T) {
		t.Parallel()
		e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: 3, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false)
		pids := make(chan int, 1)
		hold := make(chan struct{})
		first := func() error {
			return e.deliver("a", func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, "a") })
		}
		held := func() error {
			return e.deliver("held", func(ctx context.Context, tx *sqlx.Tx) error {
				pids <- backendPID(ctx, tx)
				<-hold
				return e.insert(ctx, tx, "held")
			})
		}
		done := make(chan []error, 1)
		go func() { done <- together(first, held, first) }()
		terminate(t, e, <-pids)
		close(hold)
		for _, err := range <-done {
			if err != nil { // a duplicate of "a" after the batch may run alone, on a new connection
				require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(err), "%v", err)
			}
		}
		var rows []string
		for _, k := range e.rows(t) {
			require.Equal(t, "a", k, "only a delivery that ran alone after the batch can have committed")
			rows = append(rows, k)
		}
		require.Equal(t, len(rows), e.claims(t))
	})
	t.Run("mid-commit", func(t *testing.T) {
		t.Parallel()
		// A deferred constraint trigger runs at COMMIT and waits there for
		// an advisory lock the test holds: the backend dies inside the
		// commit, after every handler of the batch returned.
		e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: 2, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false)
		var lock int64
		require.NoError(t, e.db.Get(&lock, `SELECT hashtext($1)`, e.table))
		for _, stmt := range []string{
			`CREATE FUNCTION ` + e.table + `_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock(` + fmt.Sprint(lock) + `); RETURN NULL; END $$`,
			`CREATE CONSTRAINT TRIGGER hold AFTER INSERT ON ` + e.table + ` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + e.table + `_hold()`,
		} {
			_, err := e.db.Exec(stmt)
			require.NoError(t, err)
		}
		holder, err := e.db.Connx(t.Context())
		require.NoError(t, err)
		t.Cleanup(func() { _ = holder.Close() })
		_, err = holder.ExecContext(t.Context(), `SELECT pg_advisory_lock($1)`, lock)
		require.NoError(t, err)
		pids := make(chan int, 2)
		deliver := func(key string) func() error {
			return func() error {
				return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error {
					pids <- backendPID(ctx, tx)
					return e.insert(ctx, tx, key)
				})
			}
		}
		done := make(chan []error, 1)
		go func() { done <- together(deliver("a"), deliver("b")) }()
		pid := <-pids
		require.Equal(t, pid, <-pids, "one batch")
		require.EventuallyWithT(t, func(c *assert.CollectT) { // the commit waits in the trigger
			var waiting bool
			require.NoError(c, e.db.Get(&waiting, `SELECT wait_event = 'advisory' FROM pg_stat_activity WHERE pid = $1`, pid))
			require.True(c, waiting)
		}, 2*time.Minute, 10*time.Millisecond)
		terminate(t, e, pid)
		_, err = holder.ExecContext(t.Context(), `SELECT pg_advisory_unlock($1)`, lock)
		require.NoError(t, err)
		for _, err := range <-done {
			require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(err), "%v", err)
			require.ErrorContains(t, err, "commit")
		}
		require.Empty(t, e.rows(t))
		require.Zero(t, e.claims(t))
	})
}

// A store whose units of work cannot batch (no savepoints) runs one unit
// of work per delivery, unchanged.
func TestGroupCommitOnAStoreThatCannotBatch(t *testing.T) {
	t.Parallel()
	store := deduplication.NewMemoryStore()
	stage, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c", Batch: &deduplication.BatchConfig{}})
	require.NoError(t, err)
	for range 3 {
		msg := message.NewMessage("k", nil)
		msg.Metadata.Set(sluice.EventIDKey, "k")
		msg.SetContext(context.Background())
		_, err := stage(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
		require.NoError(t, err)
	}
	require.Equal(t, 1, store.Len())
}

// A handler that returns nil although its statement aborted the PostgreSQL
// transaction (it swallowed a unique violation) fails as Transient — found
// when its savepoint is released, with the next delivery's claim or by the
// commit — and the others of its batch commit.
func TestGroupCommitAHandlerThatLeftTheTransactionAbortedFailsAlone(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 3} {
		t.Run(fmt.Sprint("batch of ", size), func(t *testing.T) {
			t.Parallel()
			e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: size, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, true)
			_, err := e.db.Exec(`INSERT INTO ` + e.table + ` (k) VALUES ('taken')`)
			require.NoError(t, err)
			swallows := func() error {
				return e.deliver("swallows", func(ctx context.Context, tx *sqlx.Tx) error {
					_ = e.insert(ctx, tx, "taken") // the error ignored: the transaction is aborted
					return nil
				})
			}
			ok := func(key string) func() error {
				return func() error {
					return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, key) })
				}
			}
			fs := []func() error{swallows}
			if size == 3 {
				fs = append(fs, ok("a"), ok("b"))
			}
			errs := together(fs...)
			require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(errs[0]), "%v", errs[0])
			for _, err := range errs[1:] {
				require.NoError(t, err)
			}
			want := []string{"taken"}
			if size == 3 {
				want = []string{"a", "b", "taken"}
			}
			require.Equal(t, want, e.rows(t))
			require.Equal(t, len(want)-1, e.claims(t), "the swallowing delivery is not recorded: it runs again")
		})
	}
}

// A key that would end a badly quoted literal is claimed as it is.
func TestGroupCommitClaimsAHostileKeyAsItIs(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: 1}, false)
	for _, key := range []string{`x'); DROP TABLE effects; --`, `a$k$b`, `ends with $k`, `$k0$$k$`, `\'`} {
		require.NoError(t, e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, key) }))
		require.NoError(t, e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return errors.New("ran twice") }), "a duplicate")
		var got string
		require.NoError(t, e.db.Get(&got, `SELECT event_key FROM `+e.inbox+` WHERE event_key = $1`, key))
		require.Equal(t, key, got)
	}
	require.Len(t, e.rows(t), 5)
}

// A claim that waits out ClaimTimeout behind another transaction's claim
// of the same key fails alone: its neighbours in the batch commit. Before,
// the claim's context deadline cancelled the statement and lib/pq closed
// the connection — the batch's — and every neighbour failed (found by a
// probe).
func TestGroupCommitAClaimTimeoutFailsAlone(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: 3, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false)
	stage, err := deduplication.New(deduplication.Config{Store: e.store, Consumer: "c", ClaimTimeout: 200 * time.Millisecond,
		Batch: &deduplication.BatchConfig{MaxBatch: 3, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}})
	require.NoError(t, err)
	e.stage = stage
	holder, err := e.db.Beginx() // another delivery of "held", still in its transaction
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback() })
	_, err = holder.Exec(`INSERT INTO ` + e.inbox + ` (consumer, event_key, processed_at) VALUES ('c', 'held', now())`)
	require.NoError(t, err)
	ok := func(key string) func() error {
		return func() error {
			return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error {
				var lockTimeout string
				if err := tx.GetContext(ctx, &lockTimeout, `SELECT current_setting('lock_timeout')`); err != nil {
					return err
				}
				if lockTimeout != "0" {
					return fmt.Errorf("the handler runs with the claim's lock_timeout %s", lockTimeout)
				}
				return e.insert(ctx, tx, key)
			})
		}
	}
	errs := together(ok("a"), ok("held"), ok("b"))
	require.NoError(t, errs[0])
	// It left the batch and waited alone: ErrClaimInProgress after
	// ClaimTimeout (or, where the cancel of its wait is slow to reach the
	// server, the store's own bound).
	require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(errs[1]), "%v", errs[1])
	require.NoError(t, errs[2])
	require.Equal(t, []string{"a", "b"}, e.rows(t))
}

// After a batch whose commit failed (a deferred constraint one delivery
// violates), its deliveries run again alone, at once: the culprit fails
// alone, its neighbours commit without spending an attempt, and the
// culprit's next attempt runs alone too. Before, they failed together,
// every time until their ladders were spent (found by a probe); then their
// next attempts ran alone.
func TestGroupCommitAfterAFailedCommitItsDeliveriesRunAlone(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "postgres", deduplication.BatchConfig{MaxBatch: 3, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}, false)
	_, err := e.db.Exec(`CREATE TABLE ` + e.table + `_parent (k TEXT PRIMARY KEY);
		ALTER TABLE ` + e.table + ` ADD CONSTRAINT parent FOREIGN KEY (k) REFERENCES ` + e.table + `_parent (k) DEFERRABLE INITIALLY DEFERRED;
		INSERT INTO ` + e.table + `_parent VALUES ('a'), ('b')`)
	require.NoError(t, err)
	ok := func(key string) func() error {
		return func() error {
			return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, key) })
		}
	}
	round := func() []error { return together(ok("a"), ok("orphan"), ok("b")) }
	errs := round() // the deferred constraint fails the batch's commit
	require.NoError(t, errs[0])
	require.Error(t, errs[1], "the culprit fails alone")
	require.NoError(t, errs[2])
	require.Equal(t, []string{"a", "b"}, e.rows(t))
	errs = round() // the copies, retried together
	require.NoError(t, errs[0], "a duplicate")
	require.Error(t, errs[1], "the culprit fails alone")
	require.NoError(t, errs[2], "a duplicate")
	require.Equal(t, []string{"a", "b"}, e.rows(t))
}

// A database that stops answering (a black hole between the inbox and
// PostgreSQL) holds no batched delivery past StoreTimeout: each fails as
// Transient with ErrStoreTimeout, counted by the brake, and nothing is
// reported done; once it answers, the deliveries are processed.
func TestGroupCommitOnAHungDatabaseFailsWithinItsBound(t *testing.T) {
	t.Parallel()
	base := testenv.Postgres(t)
	schema := testenv.Schema(t, base)
	_, err := base.Exec(`CREATE TABLE ` + schema + `.effects (k TEXT NOT NULL)`)
	require.NoError(t, err)
	testenv.SQLStore(t, base, schema+".inbox")
	u, err := url.Parse(testenv.PostgresURL)
	require.NoError(t, err)
	proxy := testenv.StartProxy(t, u.Host)
	u.Host = proxy.Addr()
	holed, err := sqlx.Connect("postgres", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = holed.Close() })
	store, err := sluicesql.NewInbox(holed, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	stage, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c", Env: sluice.Env{StoreTimeout: 300 * time.Millisecond},
		Batch: &deduplication.BatchConfig{MaxBatch: 3, MaxWait: time.Second, Linger: true, QueueTimeout: time.Minute}})
	require.NoError(t, err)
	e := &batchEnv{db: base, table: schema + ".effects", inbox: schema + ".inbox", stage: stage}
	ok := func(key string) func() error {
		return func() error {
			return e.deliver(key, func(ctx context.Context, tx *sqlx.Tx) error { return e.insert(ctx, tx, key) })
		}
	}
	proxy.BlackHole()
	for _, err := range together(ok("a"), ok("b"), ok("c")) {
		require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(err), "%v", err)
		require.ErrorIs(t, err, deduplication.ErrStoreTimeout)
		require.ErrorIs(t, err, sluice.ErrDependency, "the brake's MatchUnreachable counts it")
	}
	proxy.Heal()
	require.Empty(t, e.rows(t))
	require.Eventually(t, func() bool { // the pool's black-holed connections are found dead, one by one
		return together(ok("a"))[0] == nil
	}, 2*time.Minute, 10*time.Millisecond)
	require.Equal(t, []string{"a"}, e.rows(t))
}
