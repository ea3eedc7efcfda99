package router_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// occupy takes every connection of a server whose max_connections is n
// (none reserved) and returns a function that closes them. It holds n, not
// "as many as it got before a refusal": a backend of a connection closed
// just before (the last delivery's, or the previous occupy's) still counts
// until it has exited, so a first "too many clients" (53300) can come while
// a slot is about to free up — and a delivery would then take it. A refusal
// is retried until n are held, for at most a minute.
func occupy(t *testing.T, url string, n int) (release func()) {
	t.Helper()
	db, err := sqlx.Open("postgres", url)
	require.NoError(t, err)
	var conns []*sqlx.Conn
	deadline := time.Now().Add(time.Minute)
	for len(conns) < n {
		c, err := db.Connx(t.Context())
		if err != nil {
			state, _ := sluicesql.SQLState(err)
			require.Equal(t, "53300", state, "%v", err)
			require.True(t, time.Now().Before(deadline), "%d of the server's %d connections held after a minute", len(conns), n)
			time.Sleep(10 * time.Millisecond) // a closed connection's backend exiting: poll
			continue
		}
		conns = append(conns, c)
	}
	_, err = db.Connx(t.Context())
	state, _ := sluicesql.SQLState(err)
	require.Equal(t, "53300", state, "the server full with %d: the next connection is refused (%v)", n, err)
	return func() {
		for _, c := range conns {
			_ = c.Close()
		}
		_ = db.Close()
	}
}

// "Too many clients" (53300) at the inbox's Begin is the database refusing
// connections: once the brake has seen it down, a delivery failing with it
// is held (nacked, no attempt spent), not passed to the retry stage, until a
// whole window passes without one. A private PostgreSQL with
// max_connections 6, every connection taken: the brake engages, is released
// when connections free up, and when they run out again every delivery
// failing with 53300 is held. (Before, the first failures after each
// release — below the brake's threshold — each spent an attempt: one event
// exhausted 3 of its 4 attempts on 53300 in the run.)
func TestTooManyClientsAfterTheBrakeSawThemSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	const maxConnections = 6
	pg := testenv.StartPrivatePostgresWith(t, maxConnections)
	db, err := sqlx.Open("postgres", pg.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxIdleConns(0) // every Begin dials: the server's limit decides
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: "inbox"})
	require.NoError(t, err)
	require.NoError(t, store.CreateTable(t.Context()))

	b, err := brake.New(brake.Config{Name: "ledger", Match: brake.MatchUnreachable, Window: 10, FailureRatio: 0.5,
		CoolDown: 10 * time.Millisecond, MaxCoolDown: 20 * time.Millisecond, Pausing: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	classify, err := stage.Classify(stage.ClassifyConfig{})
	require.NoError(t, err)
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "ledger"})
	require.NoError(t, err)
	stack := b.Middleware(classify(inbox(func(*message.Message) ([]*message.Message, error) { return nil, nil })))
	n := 0
	deliver := func() error {
		n++
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", n))
		msg.SetContext(context.Background())
		_, err := stack(msg)
		return err
	}
	// spent reports a failure that reaches the retry stage: not held.
	spent := func(err error) bool { return err != nil && !errors.Is(err, sluice.ErrHeld) }

	release := occupy(t, pg.URL, maxConnections)
	require.Eventually(t, func() bool {
		err := deliver()
		require.Error(t, err)
		return b.State() == brake.Engaged
	}, 30*time.Second, time.Millisecond, "53300 engages the brake")
	release()
	require.Eventually(t, func() bool { return deliver() == nil }, 2*time.Minute, 10*time.Millisecond,
		"released once connections free up: the probe delivery commits")
	require.Equal(t, brake.Released, b.State())

	release = occupy(t, pg.URL, maxConnections) // the clients run out again
	defer release()
	spentN := 0
	for range 20 {
		err := deliver()
		require.Error(t, err)
		state, _ := sluicesql.SQLState(err)
		if !errors.Is(err, sluice.ErrHeld) {
			require.Equal(t, "53300", state, "%v", err)
		}
		if spent(err) {
			spentN++
		}
	}
	require.Zero(t, spentN, "deliveries failing with 53300 after the brake saw it that spent an attempt")
}
