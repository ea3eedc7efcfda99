package sluicesql_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/unitofwork"
)

func TestNewOutboxValidates(t *testing.T) {
	t.Parallel()
	pg := sqlx.NewDb(nil, "postgres")
	for _, tt := range []struct {
		db   *sqlx.DB
		cfg  sluicesql.OutboxConfig
		want string
	}{
		{nil, sluicesql.OutboxConfig{}, "NewOutbox: the DB is required"},
		{sqlx.NewDb(nil, "mysql"), sluicesql.OutboxConfig{}, `NewOutbox: driver "mysql" is not supported`},
		{pg, sluicesql.OutboxConfig{Table: "outbox; DROP TABLE users"}, "is not an SQL identifier"},
		{sqlx.NewDb(nil, "sqlite"), sluicesql.OutboxConfig{Table: "main.outbox"}, "schema.name on PostgreSQL only"},
	} {
		_, err := sluicesql.NewOutbox(tt.db, tt.cfg)
		require.ErrorContains(t, err, tt.want)
		require.ErrorContains(t, err, "sluicesql: ")
	}
}

// backends are the databases the store speaks, each with a table of the
// test's own.
func backends(t *testing.T) map[string]*sluicesql.Outbox {
	t.Helper()
	pg := testenv.Postgres(t)
	schema := testenv.Schema(t, pg)
	prefixes.Store(pg, schema+".")
	out := map[string]*sluicesql.Outbox{}
	for name, b := range map[string]struct {
		db  *sqlx.DB
		cfg sluicesql.OutboxConfig
	}{
		"postgres": {pg, sluicesql.OutboxConfig{Table: schema + ".outbox"}},
		"sqlite":   {testenv.SQLite(t), sluicesql.OutboxConfig{}},
	} {
		s, err := sluicesql.NewOutbox(b.db, b.cfg)
		require.NoError(t, err)
		require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), s))
		require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), s), "CreateTable is idempotent")
		out[name] = s
	}
	return out
}

// prefixes qualifies the tables a test adds beside the store's: its
// schema on PostgreSQL.
var prefixes sync.Map

func prefix(s *sluicesql.Outbox) string {
	p, _ := prefixes.Load(sluicesql.OutboxDB(s))
	v, _ := p.(string)
	return v
}

func db(t *testing.T, s *sluicesql.Outbox) *sqlx.DB {
	t.Helper()
	return sluicesql.OutboxDB(s)
}

func write(t *testing.T, s *sluicesql.Outbox, topic string, msgs ...*message.Message) {
	t.Helper()
	tx, err := db(t, s).BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.Write(t.Context(), tx, topic, msgs...))
	require.NoError(t, tx.Commit())
}

func TestWriteThenDueThenFinish(t *testing.T) {
	t.Parallel()
	for name, s := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			with := message.NewMessage("uuid-1", []byte(`{"a":1}`))
			with.Metadata.Set(sluice.EventIDKey, "evt-1")
			with.Metadata.Set("k", "v\x00\n\"")
			with.Metadata.Set("not utf-8 \xff", "\xfe\xff")
			without := message.NewMessage("", nil) // no UUID, no payload, no event id
			write(t, s, "orders.created", with, without)
			require.NotEmpty(t, without.UUID, "a message id is given at write time")
			require.Equal(t, without.UUID, without.Metadata.Get(sluice.EventIDKey), "so is an event id")

			st, err := s.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(2), st.Pending)
			require.Zero(t, st.Failing)
			require.WithinDuration(t, time.Now(), st.Oldest, time.Minute)

			b, err := s.Due(ctx, 10, 0)
			require.NoError(t, err)
			rows := b.Rows()
			require.Len(t, rows, 2)
			require.Less(t, rows[0].ID, rows[1].ID, "oldest first")
			require.Equal(t, "orders.created", rows[0].Topic)
			require.Equal(t, "uuid-1", rows[0].Message.UUID)
			require.Equal(t, `{"a":1}`, string(rows[0].Message.Payload))
			require.Equal(t, "evt-1", rows[0].Message.Metadata.Get(sluice.EventIDKey))
			require.Equal(t, "v\x00\n\"", rows[0].Message.Metadata.Get("k"), "metadata round-trips byte for byte")
			require.Equal(t, "\xfe\xff", rows[0].Message.Metadata.Get("not utf-8 \xff"), "also what is not UTF-8")
			require.Equal(t, without.UUID, rows[1].Message.UUID)
			require.Empty(t, rows[1].Message.Payload)

			next := time.Now().Add(time.Hour)
			require.NoError(t, b.Finish(ctx, []int64{rows[0].ID}, []outbox.Failed{{ID: rows[1].ID, Err: "returned: no route", NextAttempt: next}}))
			st, err = s.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(1), st.Pending, "the relayed row is deleted, the failed one kept")
			require.Equal(t, int64(1), st.Failing)

			b, err = s.Due(ctx, 10, 0)
			require.NoError(t, err)
			require.Empty(t, b.Rows(), "a failed row waits for its next attempt")
			require.NoError(t, b.Release(ctx))

			list, err := s.List(ctx, sluicesql.OutboxFailing, 10)
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.Equal(t, "returned: no route", list[0].LastError)
			require.Equal(t, 1, list[0].Attempts)
			require.Equal(t, without.UUID, list[0].EventID)
			require.WithinDuration(t, next, list[0].NextAttempt, time.Second)

			n, err := s.RetryNow(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			b, err = s.Due(ctx, 10, 0)
			require.NoError(t, err)
			require.Len(t, b.Rows(), 1, "RetryNow makes it due")
			require.Equal(t, 1, b.Rows()[0].Attempts)
			require.NoError(t, b.Finish(ctx, []int64{b.Rows()[0].ID}, nil))
			st, err = s.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, outbox.Stats{}, st, "empty")
		})
	}
}

// Two relays never hold the same row: PostgreSQL's SKIP LOCKED, SQLite's
// lease. A released batch is due again at once.
func TestTwoBatchesNeverShareARow(t *testing.T) {
	t.Parallel()
	for name, s := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			msgs := make([]*message.Message, 250)
			for i := range msgs {
				msgs[i] = message.NewMessage(fmt.Sprint("m-", i), nil)
			}
			write(t, s, "t", msgs...)
			a, err := s.Due(ctx, 100, 0)
			require.NoError(t, err)
			b, err := s.Due(ctx, 200, 0)
			require.NoError(t, err)
			require.Len(t, a.Rows(), 100)
			require.Len(t, b.Rows(), 150)
			seen := map[int64]bool{}
			for _, r := range append(a.Rows(), b.Rows()...) {
				require.False(t, seen[r.ID], "row %d held twice", r.ID)
				seen[r.ID] = true
			}
			require.NoError(t, a.Release(ctx))
			c, err := s.Due(ctx, 500, 0)
			require.NoError(t, err)
			require.Len(t, c.Rows(), 100, "the released rows, not those b holds")
			require.NoError(t, c.Release(ctx))
			require.NoError(t, b.Release(ctx))
		})
	}
}

// Concurrent relays, each taking and finishing batches: every row is
// taken exactly once.
func TestConcurrentBatchesTakeEveryRowOnce(t *testing.T) {
	t.Parallel()
	for name, s := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			const n = 1000
			for i := range n / 100 {
				msgs := make([]*message.Message, 100)
				for j := range msgs {
					msgs[j] = message.NewMessage(fmt.Sprint("m-", i*100+j), nil)
				}
				write(t, s, "t", msgs...)
			}
			var mu sync.Mutex
			taken := map[string]int{}
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for {
						b, err := s.Due(ctx, 37, 0)
						if !assertNoError(t, err) {
							return
						}
						rows := b.Rows()
						if len(rows) == 0 {
							_ = b.Release(ctx)
							return
						}
						ids := make([]int64, len(rows))
						mu.Lock()
						for i, r := range rows {
							taken[r.Message.UUID]++
							ids[i] = r.ID
						}
						mu.Unlock()
						if !assertNoError(t, b.Finish(ctx, ids, nil)) {
							return
						}
					}
				})
			}
			wg.Wait()
			require.Len(t, taken, n)
			for id, k := range taken {
				require.Equal(t, 1, k, "%s taken %d times", id, k)
			}
		})
	}
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil && !strings.Contains(err.Error(), "database is locked") {
		t.Error(err)
		return false
	}
	return true
}

// Publish writes in the inbox's transaction: committed with it, rolled
// back with it, refused outside one.
func TestPublishWritesInTheInboxTransaction(t *testing.T) {
	t.Parallel()
	for name, s := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			require.ErrorIs(t, s.Publish(ctx, "t", message.NewMessage("x", nil)), unitofwork.ErrMissing)

			store := testenv.SQLStore(t, sluicesql.OutboxDB(s), prefix(s)+"inbox")
			stage, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c"})
			require.NoError(t, err)
			run := func(key string, fail bool) error {
				msg := message.NewMessage(key, nil)
				msg.Metadata.Set(sluice.EventIDKey, key)
				msg.SetContext(ctx)
				_, err := stage(func(msg *message.Message) ([]*message.Message, error) {
					require.NotNil(t, sluicesql.TxFromContext(msg.Context()))
					if err := s.Publish(msg.Context(), "produced", message.NewMessage("from-"+key, nil)); err != nil {
						return nil, err
					}
					if fail {
						return nil, sluice.Transient(fmt.Errorf("boom"))
					}
					return nil, nil
				})(msg)
				return err
			}
			require.Error(t, run("rolled-back", true))
			require.NoError(t, run("committed", false))
			select {
			case <-s.Wakeups():
			default:
				t.Fatal("the commit woke the relay")
			}
			b, err := s.Due(ctx, 10, 0)
			require.NoError(t, err)
			require.Len(t, b.Rows(), 1, "only the committed delivery's message")
			require.Equal(t, "from-committed", b.Rows()[0].Message.UUID)
			require.NoError(t, b.Release(ctx))
		})
	}
}

// An outbox on another database than the inbox's is refused, not written
// beside the transaction.
func TestPublishRefusesAnotherDialect(t *testing.T) {
	t.Parallel()
	lite, err := sluicesql.NewOutbox(testenv.SQLite(t), sluicesql.OutboxConfig{})
	require.NoError(t, err)
	pg := testenv.Postgres(t)
	store := testenv.SQLStore(t, pg, testenv.Schema(t, pg)+".inbox")
	stage, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c"})
	require.NoError(t, err)
	msg := message.NewMessage("k", nil)
	msg.Metadata.Set(sluice.EventIDKey, "k")
	msg.SetContext(context.Background())
	_, err = stage(func(msg *message.Message) ([]*message.Message, error) {
		return nil, lite.Publish(msg.Context(), "t", message.NewMessage("x", nil))
	})(msg)
	require.ErrorIs(t, err, unitofwork.ErrMissing)
	require.ErrorContains(t, err, "the inbox's transaction is on postgres, the outbox on sqlite")
}

// A produced message continues the trace of the delivery that produced it;
// a producer's own trace context is kept.
func TestWriteCarriesTheTraceContext(t *testing.T) {
	t.Parallel()
	s := backends(t)["sqlite"]
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(t.Context(), sc)
	own := message.NewMessage("own", nil)
	own.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	tx, err := sluicesql.OutboxDB(s).BeginTxx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, s.Write(ctx, tx, "t", message.NewMessage("new", nil), own))
	require.NoError(t, tx.Commit())
	b, err := s.Due(ctx, 10, 0)
	require.NoError(t, err)
	require.Equal(t, "00-01000000000000000000000000000000-0200000000000000-01", b.Rows()[0].Message.Metadata.Get("traceparent"))
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", b.Rows()[1].Message.Metadata.Get("traceparent"))
	require.NoError(t, b.Release(ctx))
}

// A batch a relay holds on PostgreSQL is released the moment its
// connection ends (a relay killed mid-batch): another takes its rows at
// once. On SQLite, when its lease runs out.
func TestAHeldBatchIsReleasedWhenItsRelayIsGone(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		ctx := t.Context()
		s := backends(t)["postgres"]
		own, err := sqlx.Connect("postgres", testenv.PostgresURL) // the doomed relay's pool
		require.NoError(t, err)
		t.Cleanup(func() { _ = own.Close() })
		doomed, err := sluicesql.NewOutbox(own, sluicesql.OutboxConfig{Table: s.Name()})
		require.NoError(t, err)
		write(t, s, "t", message.NewMessage("a", nil), message.NewMessage("b", nil))
		held, err := doomed.Due(ctx, 10, 0)
		require.NoError(t, err)
		require.Len(t, held.Rows(), 2)
		other, err := s.Due(ctx, 10, 0)
		require.NoError(t, err)
		require.Empty(t, other.Rows(), "held")
		require.NoError(t, other.Release(ctx))

		var terminated bool
		require.NoError(t, sluicesql.OutboxDB(s).GetContext(ctx, &terminated,
			`SELECT pg_terminate_backend(pid) FROM pg_locks WHERE relation = $1::regclass AND mode = 'RowShareLock' AND pid <> pg_backend_pid() LIMIT 1`, s.Name()))
		require.True(t, terminated)
		require.Eventually(t, func() bool {
			b, err := s.Due(ctx, 10, 0)
			require.NoError(t, err)
			defer func() { require.NoError(t, b.Release(ctx)) }()
			return len(b.Rows()) == 2
		}, time.Minute, 10*time.Millisecond)
		require.Error(t, held.Finish(ctx, []int64{held.Rows()[0].ID}, nil), "the killed relay's batch cannot finish")
	})
	t.Run("sqlite", func(t *testing.T) {
		ctx := t.Context()
		db := testenv.SQLite(t)
		const lease = 3 * time.Second // the relay's batch: held until its context ends
		s, err := sluicesql.NewOutbox(db, sluicesql.OutboxConfig{})
		require.NoError(t, err)
		require.NoError(t, sluicesql.CreateOutboxTable(ctx, s))
		write(t, s, "t", message.NewMessage("a", nil))
		taken := time.Now()
		life, cancel := context.WithTimeout(ctx, lease)
		defer cancel()
		held, err := s.Due(life, 10, 0)
		require.NoError(t, err)
		require.Len(t, held.Rows(), 1)
		b, err := s.Due(ctx, 10, 0)
		require.NoError(t, err)
		if time.Since(taken) < lease { // a loaded machine may take longer: the lease is then over
			require.Empty(t, b.Rows(), "leased")
		}
		require.Eventually(t, func() bool {
			b, err := s.Due(ctx, 10, 0)
			require.NoError(t, err)
			return len(b.Rows()) == 1
		}, 2*time.Minute, 10*time.Millisecond, "taken again once the lease ran out")
	})
}
