package console_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/internal/testenv"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

// holedAfterHandshake returns a Config.Dial that connects to the test
// broker through a proxy and black-holes the connection once its handshake
// is done — the broker accepted it, then nothing comes back, as from a
// frozen host — and counts its dials.
func holedAfterHandshake(t *testing.T) (func() (*amqp.Connection, error), *atomic.Int32) {
	t.Helper()
	proxy, url := testenv.ProxyAMQP(t)
	var (
		mu    sync.Mutex
		dials atomic.Int32
	)
	return func() (*amqp.Connection, error) {
		mu.Lock()
		defer mu.Unlock()
		dials.Add(1)
		proxy.HealNewConnections() // the connections black-holed so far stay so
		conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url}, "console black hole")
		proxy.BlackHole()
		return conn, err
	}, &dials
}

// sampling returns a console that samples its one family's depth through
// dial every interval, with a CallTimeout of a minute (longer than any
// wait the tests allow), closed when t ends (Close is idempotent).
func sampling(t *testing.T, dial func() (*amqp.Connection, error), interval time.Duration) *console.Console {
	t.Helper()
	q := testenv.Name("console_holed")
	c, err := console.New(console.Config{Dial: dial, ReadOnly: true, SampleInterval: interval, CallTimeout: time.Minute,
		Queues: []console.Queue{{Name: q, Poison: q + ".poison"}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The overview's depth reads on a broker that accepted the connection and
// then went silent fail after CallTimeout, each row naming the wait, where
// the page waited for the AMQP heartbeat to give the connection up (three
// heartbeats: 30 s with amqp091-go's default of 10 s; no answer in the
// test's 20 s).
func TestABlackHoledBrokerHoldsNoOverviewPastCallTimeout(t *testing.T) {
	t.Parallel()
	dial, _ := holedAfterHandshake(t)
	q := testenv.Name("console_holed")
	c, err := console.New(console.Config{Dial: dial, ReadOnly: true, SampleInterval: -1, CallTimeout: time.Second,
		Queues: []console.Queue{{Name: q, Tiers: []string{q + ".retry.1m"}, Poison: q + ".poison"}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	w := httptest.NewRecorder()
	testenv.Within(t, 20*time.Second, "the overview", func() { c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil)) })
	body, _ := io.ReadAll(w.Result().Body)
	require.Equal(t, http.StatusOK, w.Code, "the page, with each row's error")
	require.Contains(t, string(body), "a passive declare of "+q+": the broker gave no answer within 1s")
}

// A chart's sample on a broker that went silent after the handshake ends
// with its SampleInterval — the next sample dials again — and Close ends
// one in progress at once; before, the sampler waited for the heartbeat,
// and Close with it.
func TestABlackHoledBrokerHoldsNoChartSamplePastItsInterval(t *testing.T) {
	t.Parallel()
	dial, dials := holedAfterHandshake(t)
	c := sampling(t, dial, time.Second)
	require.Eventually(t, func() bool { return dials.Load() >= 3 }, 2*time.Minute, 50*time.Millisecond,
		"a sample every SampleInterval (1 s), each given up at its end")
	testenv.Within(t, 20*time.Second, "Close", func() { _ = c.Close() }) // the sample in progress ends at once; its CallTimeout is a minute
}

// A sample whose dial outlasts its SampleInterval closes its connection to
// a silent broker without waiting for the close-ok: the sampler and Close
// go on at once. Before, the sample closed the connection (the console's
// context live, or ended by Close) waiting up to CallTimeout — a minute
// here — for a close-ok that never came: a Close at load average 20 took 77 s
// in TestABlackHoledBrokerHoldsNoChartSamplePastItsInterval.
func TestASampleWhoseDialOutlastsItsIntervalHoldsNoClose(t *testing.T) {
	t.Parallel()
	holed, dials := holedAfterHandshake(t)
	const interval = 200 * time.Millisecond
	dialed := make(chan struct{}, 1)
	dial := func() (*amqp.Connection, error) {
		conn, err := holed()
		<-time.After(2 * interval) // the fault: a dial slower than the sample's interval
		select {
		case dialed <- struct{}{}:
		default:
		}
		return conn, err
	}
	c := sampling(t, dial, interval)
	select {
	case <-dialed:
	case <-time.After(2 * time.Minute):
		t.Fatal("the sampler did not dial")
	}
	require.Eventually(t, func() bool { return dials.Load() >= 2 }, 2*time.Minute, 10*time.Millisecond,
		"the sampler went on to its next sample")
	testenv.Within(t, 20*time.Second, "Close", func() { _ = c.Close() })
}

// The outbox page on a database that went silent — the connection up,
// nothing coming back — answers after CallTimeout (and the pool's
// CancelGrace: sluicesql/postgres.Open's, as `sluice console --outbox-db`
// opens it), the outbox's row naming the call; before, the request's
// context, which does not end by itself, was the only bound of the store's
// calls, and the page never answered.
func TestABlackHoledDatabaseHoldsNoOutboxPagePastCallTimeout(t *testing.T) {
	t.Parallel()
	schema := testenv.Schema(t, testenv.Postgres(t))
	proxy, dsn := testenv.ProxyPostgresURL(t)
	db, err := postgres.Open(postgres.Config{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ob := testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Outbox: sluicesql.OutboxConfig{Table: "outbox"}}).Outbox
	c, err := console.New(console.Config{Dial: func() (*amqp.Connection, error) { return nil, errors.New("no broker here") },
		ReadOnly: true, SampleInterval: -1, CallTimeout: time.Second, Outboxes: map[string]console.Outbox{"orders": console.SQLOutbox(ob)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	get := func() (string, time.Duration) {
		w := httptest.NewRecorder()
		took := testenv.Within(t, 20*time.Second, "the outbox page", func() { c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/outbox", nil)) })
		body, _ := io.ReadAll(w.Result().Body)
		require.Equal(t, http.StatusOK, w.Code)
		return string(body), took
	}
	body, _ := get()
	require.NotContains(t, body, "did not answer", "the database answers")

	proxy.BlackHole()
	body, _ = get() // within 20 s: CallTimeout (1 s) and CancelGrace for each of the page's calls; before, never
	require.Contains(t, body, "counting the outbox&#39;s rows: no answer within 1s")
}
