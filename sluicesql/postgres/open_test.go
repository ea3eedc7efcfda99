package postgres_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOpenValidates(t *testing.T) {
	t.Parallel()
	_, err := postgres.Open(postgres.Config{})
	require.ErrorContains(t, err, "Config.DSN is required")
	_, err = postgres.Open(postgres.Config{DSN: "postgres://u@h/db", CancelGrace: -time.Second})
	require.ErrorContains(t, err, "Config.CancelGrace must not be negative")
	_, err = postgres.Open(postgres.Config{DSN: "postgres://u:s3cret@h/db?sslmode=nonsense"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
}

// A pool of one connection, caught by a black hole mid-statement: the
// statement fails CancelGrace after its context ended, and once the
// network heals — without resetting the stalled connection — the next
// statement runs on a new connection. (With sqlx.Open, the first
// statement never returns and the pool's one place stays taken.)
func TestAStalledConnectionIsClosedAndReplaced(t *testing.T) {
	t.Parallel()
	proxy, db := openBehindProxy(t)
	db.SetMaxOpenConns(1)
	require.NoError(t, db.PingContext(t.Context()))

	proxy.BlackHole()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := db.ExecContext(ctx, `SELECT 1`)
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second, "the statement returns after its context and the grace")

	proxy.HealNewConnections()
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var one int
	require.NoError(t, db.GetContext(ctx, &one, `SELECT 1`), "a new connection replaces the stalled one")
	require.Equal(t, 1, one)
}

// A pool's idle connections caught by the same black hole as the one a
// statement got no answer on are not handed out again once the network
// heals without resetting them: each is refused as it is taken, and the
// pool opens a new one. Before, each statement that took one waited its
// whole deadline (a delivery's attempt spent: 1–2 of 400 events exhausted
// in router.TestAConsumerResumesAfterABlackHoleThatHealsWithoutResets).
func TestIdleConnectionsCaughtByTheSameBlackHoleAreNotReused(t *testing.T) {
	t.Parallel()
	proxy, db := openBehindProxy(t)
	const idle = 4
	db.SetMaxOpenConns(idle)
	db.SetMaxIdleConns(idle)
	conns := make([]*sql.Conn, idle) // open 4 at once: 4 idle once closed
	for i := range conns {
		var err error
		conns[i], err = db.Conn(t.Context())
		require.NoError(t, err)
		require.NoError(t, conns[i].PingContext(t.Context()))
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	require.Equal(t, idle, db.Stats().Idle)

	proxy.BlackHole()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := db.ExecContext(ctx, `SELECT 1`)
	require.ErrorContains(t, err, "no answer", "the statement met the black hole")

	proxy.HealNewConnections()
	for i := range idle {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		var one int
		require.NoError(t, db.GetContext(ctx, &one, `SELECT 1`), "statement %d after the heal ran on a live connection", i)
		cancel()
	}
}

// openBehindProxy opens Open's pool on PostgreSQL through a proxy the test
// controls, with a CancelGrace of 100 ms; closed when t ends.
func openBehindProxy(t *testing.T) (*testenv.Proxy, *sqlx.DB) {
	t.Helper()
	proxy, dsn := testenv.ProxyPostgresURL(t)
	db, err := postgres.Open(postgres.Config{DSN: dsn, CancelGrace: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return proxy, db
}

// A consumer's deliveries in flight, each in its transaction, then the
// next burst: Open's pool keeps the connections the first burst opened
// (database/sql keeps 2, so 14 of 16 were closed after each burst and
// opened again — a PostgreSQL server process forked for each, 30 ms of
// CPU on the test machine). SetMaxOpenConns lowers the idle cap with it.
func TestOpensPoolKeepsTheConnectionsItsDeliveriesInFlightOpened(t *testing.T) {
	t.Parallel()
	db, err := postgres.Open(postgres.Config{DSN: testenv.PostgresURL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	const inFlight, bursts = 16, 4
	backends := map[int]bool{}
	for range bursts {
		var all sync.WaitGroup
		var mu sync.Mutex
		in := make(chan struct{}, inFlight)
		release := make(chan struct{})
		for range inFlight {
			all.Add(1)
			go func() {
				defer all.Done()
				tx, err := db.BeginTxx(t.Context(), nil)
				if !assert.NoError(t, err) {
					in <- struct{}{}
					return
				}
				defer func() { assert.NoError(t, tx.Commit()) }()
				var pid int
				assert.NoError(t, tx.Get(&pid, "SELECT pg_backend_pid()"))
				mu.Lock()
				backends[pid] = true
				mu.Unlock()
				in <- struct{}{}
				<-release // every delivery of the burst holds its connection at once
			}()
		}
		for range inFlight {
			<-in
		}
		close(release)
		all.Wait()
	}
	require.Len(t, backends, inFlight, "one server process per delivery in flight, kept across the bursts")
	require.Zero(t, db.Stats().MaxIdleClosed, "no connection closed for the idle cap")

	db.SetMaxOpenConns(4)
	require.Equal(t, 4, db.Stats().Idle, "SetMaxOpenConns lowers the idle cap with it")
}
