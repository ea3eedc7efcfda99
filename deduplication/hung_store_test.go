package deduplication_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// TestBlackHoledDatabaseFreezesNoHandler: PostgreSQL behind a proxy that
// black-holes every connection — established ones and new ones — with the
// default DSN (no connect_timeout: lib/pq's start-up then waits forever, and
// its cancel request cannot get through). Every one of 16 concurrent
// deliveries comes back as a Transient ErrStoreTimeout, the brake
// (MatchUnreachable) engages, and once the network heals deliveries are
// processed again. (Before: all 16 froze in Store.Begin until the fault
// cleared.)
func TestBlackHoledDatabaseFreezesNoHandler(t *testing.T) {
	t.Parallel()
	_, schema, u := inboxSchema(t)
	proxy := testenv.StartProxy(t, u.Host)
	u.Host = proxy.Addr()
	db, err := sqlx.Open("postgres", u.String()) // no connect_timeout, no keepalive settings
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	// The pool keeps what the warm-up opens (database/sql keeps 2 idle
	// connections by default): at load average 16 every delivery of the
	// warm-up opened a connection of its own, slower than the inbox's
	// 300 ms, and none ever committed in 2 minutes.
	db.SetMaxIdleConns(16)
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)

	b, err := brake.New(brake.Config{Name: "inventory", Match: brake.MatchUnreachable, Window: 10, FailureRatio: 0.5,
		CoolDown: time.Hour, Pausing: true})
	require.NoError(t, err)
	classify, err := stage.Classify(stage.ClassifyConfig{})
	require.NoError(t, err)
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "inventory", Env: sluice.Env{StoreTimeout: 300 * time.Millisecond}})
	require.NoError(t, err)
	var mu sync.Mutex
	handled := 0
	h := classify(inbox(func(*message.Message) ([]*message.Message, error) {
		mu.Lock()
		handled++
		mu.Unlock()
		return nil, nil
	}))
	const inFlight = 16
	// Warm the pool: connections that the black hole will catch mid-life.
	// Through an inbox of its own on the same store with a generous
	// timeout: on a loaded machine (load average 40 on 2 cores in a CI run)
	// a new connection takes longer than the tested inbox's 300 ms, and not
	// one warm delivery through it committed in 2 minutes.
	warmInbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "inventory", Env: sluice.Env{StoreTimeout: time.Minute}})
	require.NoError(t, err)
	warm := classify(warmInbox(func(*message.Message) ([]*message.Message, error) { return nil, nil }))
	var wg sync.WaitGroup
	for i := range inFlight {
		wg.Go(func() { require.NoError(t, deliver(warm, fmt.Sprint("warm-", i))) })
	}
	wg.Wait()

	proxy.BlackHole()
	errs := make(chan error, inFlight)
	for i := range inFlight {
		go func() { errs <- deliver(b.Middleware(h), fmt.Sprint("held-", i)) }()
	}
	deadline := time.After(30 * time.Second) // a liveness bound, not a measurement: each returns after ~0.4 s
	timeouts := 0
	for range inFlight {
		select {
		case err := <-errs:
			require.Error(t, err)
			require.ErrorIs(t, err, deduplication.ErrStoreTimeout)
			require.ErrorIs(t, err, sluice.ErrDependency)
			timeouts++
			if !errors.Is(err, sluice.ErrHeld) { // the failure that tripped the brake is held
				require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))
			}
		case <-deadline:
			proxy.Heal()
			t.Fatalf("handlers frozen on the black-holed database: %d of %d returned", timeouts, inFlight)
		}
	}
	require.Equal(t, brake.Engaged, b.State(), "the store's timeouts engage the brake")
	require.ErrorIs(t, deliver(b.Middleware(h), "next"), sluice.ErrHeld, "engaged: the next delivery goes back unprocessed")

	mu.Lock()
	require.Zero(t, handled, "no handler ran while the database was unreachable")
	mu.Unlock()

	proxy.Heal()
	require.Eventually(t, func() bool { return deliver(h, "after") == nil }, 2*time.Minute, 50*time.Millisecond,
		"processed again once the network heals")
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, handled, "the handler ran once the network healed")
}

// inboxSchema is a PostgreSQL schema of the test's own with an inbox table
// in it, and the server's URL.
func inboxSchema(t *testing.T) (admin *sqlx.DB, schema string, u *url.URL) {
	t.Helper()
	admin = testenv.Postgres(t)
	schema = testenv.Schema(t, admin)
	testenv.SQLStore(t, admin, schema+".inbox")
	u, err := url.Parse(testenv.PostgresURL)
	require.NoError(t, err)
	return admin, schema, u
}

// deliver hands the handler stack a message of the event id.
func deliver(stack message.HandlerFunc, id string) error {
	return deliverCtx(context.Background(), stack, id)
}

// deliverCtx is deliver with the message's context.
func deliverCtx(ctx context.Context, stack message.HandlerFunc, id string) error {
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(sluice.EventIDKey, id)
	msg.SetContext(ctx)
	_, err := stack(msg)
	return err
}

// viaDialer dials a for the database's connections until viaB, then b: a
// pool whose connections opened so far stay reachable, and whose new ones
// meet a database that stopped answering (b black-holed).
type viaDialer struct {
	a, b string
	viaB atomic.Bool
}

func (d *viaDialer) addr() string {
	if d.viaB.Load() {
		return d.b
	}
	return d.a
}

func (d *viaDialer) Dial(network, _ string) (net.Conn, error) { return net.Dial(network, d.addr()) }

func (d *viaDialer) DialTimeout(network, _ string, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout(network, d.addr(), timeout)
}

// A delivery whose commit the stage refuses — 64 store calls given up
// already and still outstanding (new connections to a database that
// stopped answering) — has its transaction rolled back, not left open on
// its connection: the refused call is released as a given-up call is. The
// next delivery of its event, through another stage, claims the key and
// runs. Before, the refused commit reported itself given up, and the stage
// left the transaction to a late return that never came: it stayed open
// with the event's claim held, and every delivery of the event waited
// ClaimTimeout for its lock and failed as ErrClaimInProgress, for as long
// as the process lived.
func TestAUnitOfWorkWhoseCommitIsRefusedIsRolledBack(t *testing.T) {
	t.Parallel()
	admin, schema, u := inboxSchema(t)
	a, b := testenv.StartProxy(t, u.Host), testenv.StartProxy(t, u.Host)
	b.BlackHole()
	dialer := &viaDialer{a: a.Addr(), b: b.Addr()}
	connector, err := pq.NewConnector(testenv.PostgresURL)
	require.NoError(t, err)
	connector.Dialer(dialer)
	db := sqlx.NewDb(sql.OpenDB(connector), "postgres")
	t.Cleanup(func() { _ = db.Close() })
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	// StoreTimeout: 64 calls given up after it at once; the held
	// delivery's begin and claim within it on a loaded machine.
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c", Env: sluice.Env{StoreTimeout: 5 * time.Second}})
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	h := inbox(func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get(sluice.EventIDKey) == "held" {
			close(entered)
			<-release
		}
		return nil, nil
	})
	held := make(chan error, 1)
	go func() { held <- deliver(h, "held") }()
	select {
	case <-entered: // its transaction open, its claim taken, on a connection through a
	case err := <-held:
		t.Fatalf("the held delivery returned before its handler ran: %v", err)
	}

	dialer.viaB.Store(true)
	const outstanding = 64 // the stage's abandonedMax
	var wg sync.WaitGroup
	for i := range outstanding {
		wg.Go(func() {
			// Given up after StoreTimeout, or refused once 64 are.
			assert.ErrorIs(t, deliver(h, fmt.Sprint("other-", i)), deduplication.ErrStoreTimeout)
		})
	}
	wg.Wait()
	close(release)
	err = <-held
	require.ErrorIs(t, err, deduplication.ErrStoreTimeout, "its commit refused: 64 calls outstanding")

	directStore, err := sluicesql.NewInbox(admin, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	direct, err := deduplication.New(deduplication.Config{Store: directStore, Consumer: "c",
		ClaimTimeout: 30 * time.Second}) // a liveness bound: before, the claim waited all of it for the lock
	require.NoError(t, err)
	ran := false
	require.NoError(t, deliver(direct(func(*message.Message) ([]*message.Message, error) {
		ran = true
		return nil, nil
	}), "held"), "the refused unit of work still holds the event's claim")
	require.True(t, ran, "its commit refused, the event was not recorded: it runs again")
}

// blackHoledClaim is the scene of a claim that waits for a key another
// open transaction holds, through a proxy that then black-holes the
// database: the store through the proxy, and k01 held through a direct
// connection. hold black-holes the proxy once a claim waits for k01's
// lock (the delivery whose outcome it is given must not have returned);
// reset lets a claim still stuck in lib/pq fail, for the cleanup.
func blackHoledClaim(t *testing.T) (store *sluicesql.Inbox, hold func(outcome <-chan error), reset func()) {
	t.Helper()
	admin, schema, u := inboxSchema(t)
	proxy := testenv.StartProxy(t, u.Host)
	u.Host = proxy.Addr()
	db, err := sqlx.Open("postgres", u.String()) // no connect_timeout: lib/pq's cancel request waits
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err = sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	direct, err := sluicesql.NewInbox(admin, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	holder, err := direct.Begin(context.Background())
	require.NoError(t, err)
	claimed, err := holder.Claim(context.Background(), "c", "k01")
	require.NoError(t, err)
	require.True(t, claimed)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	hold = func(outcome <-chan error) {
		testenv.AwaitLockWait(t, admin, schema, 0, outcome)
		proxy.BlackHole()
	}
	return store, hold, proxy.Reset
}

// returnsOnceEnded waits for the delivery's outcome after its context was
// cancelled: within a liveness bound, and not the store's failure.
func returnsOnceEnded(t *testing.T, outcome <-chan error, reset func()) {
	t.Helper()
	select {
	case err := <-outcome:
		require.Error(t, err)
		var dep *sluice.DependencyError
		require.False(t, errors.As(err, &dep), "the delivery's context ended: not the store's failure: %v", err)
	case <-time.After(time.Minute): // a liveness bound: the claim is given up 100 ms after the cancel
		reset()
		t.Fatalf("still in its claim a minute after its context ended, on the black-holed database: %v", <-outcome)
	}
}

// With a negative ClaimTimeout ("no bound but the message context's") a
// claim that waits for a held key is given up once the delivery's context
// ends, though lib/pq does not honour it toward a black-holed database —
// as a StoreTimeout's bound does, and not as the store's failure. Before,
// the claim ran unbounded, and the delivery stayed in its claim until the
// connection broke (the test's liveness bound).
func TestAClaimWithoutAClaimTimeoutEndsWithItsDeliveryOnABlackHoledDatabase(t *testing.T) {
	t.Parallel()
	store, hold, reset := blackHoledClaim(t)
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c", ClaimTimeout: -1})
	require.NoError(t, err)
	h := inbox(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outcome := make(chan error, 1)
	go func() { outcome <- deliverCtx(ctx, h, "k01") }()
	hold(outcome)
	cancel()
	returnsOnceEnded(t, outcome, reset)
}

// The same for a batch handler's delivery that left its batch to wait for
// its held key alone. Before, its claim ran unbounded (since 3a711de, which
// ran it on the delivery's context), or within StoreTimeout as the store's
// failure (before that).
func TestABatchHandlersClaimWithoutAClaimTimeoutEndsWithItsDeliveryOnABlackHoledDatabase(t *testing.T) {
	t.Parallel()
	store, hold, reset := blackHoledClaim(t)
	h, err := deduplication.NewBatchHandler(deduplication.Config{Store: store, Consumer: "c", ClaimTimeout: -1},
		deduplication.BatchHandler{MaxBatch: 2, MaxWait: time.Second,
			Handle: func(context.Context, []*message.Message) []error { return nil }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k00, k01 := make(chan error, 1), make(chan error, 1)
	go func() { k00 <- deliverCtx(context.Background(), h, "k00") }()
	go func() { k01 <- deliverCtx(ctx, h, "k01") }()
	<-k00 // its batch ended: k01 in it left for its held key, or came alone
	hold(k01)
	cancel()
	returnsOnceEnded(t, k01, reset)
}
