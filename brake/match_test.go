package brake_test

import (
	"fmt"
	"net/url"
	"testing"

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

// engagesOn runs deliveries through brake(MatchUnreachable) → classify →
// inbox on store, every one a good event, and requires the brake to engage
// within its window: the failure is the dependency's, not the messages'.
func engagesOn(t *testing.T, store deduplication.Store) {
	t.Helper()
	b, _ := newBrake(t, brake.Config{Match: brake.MatchUnreachable, Window: 10, FailureRatio: 0.5, Pausing: true})
	classify, err := stage.Classify(stage.ClassifyConfig{})
	require.NoError(t, err)
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "inventory"})
	require.NoError(t, err)
	handled := 0
	h := b.Middleware(classify(inbox(func(*message.Message) ([]*message.Message, error) { handled++; return nil, nil })))
	var last error
	for i := range 10 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("evt-%d", i))
		_, last = h(msg)
		require.Error(t, last)
		if b.State() == brake.Engaged {
			break
		}
	}
	require.Equal(t, brake.Engaged, b.State(), "the brake engages on the store's failures (last: %v)", last)
	require.ErrorIs(t, last, sluice.ErrHeld)
	require.Zero(t, handled)
}

// TestMatchUnreachableTooManyConnections: PostgreSQL refusing a connection
// with SQLSTATE 53300 (too many connections — here for a role whose
// connection limit is spent) is an outage. (Before: class 53 was not
// matched, the brake never engaged, every good event spent its ladder.)
func TestMatchUnreachableTooManyConnections(t *testing.T) {
	t.Parallel()
	admin := testenv.Postgres(t)
	role := testenv.Name("full")
	_, err := admin.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN CONNECTION LIMIT 0`, role))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(`DROP ROLE ` + role) })
	u, err := url.Parse(testenv.PostgresURL)
	require.NoError(t, err)
	u.User = url.User(role)
	db, err := sqlx.Open("postgres", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	err = db.Ping()
	state, ok := sluicesql.SQLState(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "53300", state, "%v", err)
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{})
	require.NoError(t, err)
	engagesOn(t, store)
}

// TestMatchUnreachableInboxTableGone: the inbox table dropped by a bad
// migration fails every claim (42P01); that is the store's failure, not the
// messages'. (Before: no engagement, every good event exhausted.)
func TestMatchUnreachableInboxTableGone(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	store := testenv.SQLStore(t, db, schema+".inbox")
	_, err := db.Exec(`DROP TABLE ` + schema + `.inbox`)
	require.NoError(t, err)
	engagesOn(t, store)
}

// A claim that times out behind a concurrent delivery of the same key is
// contention, not an outage, and a handler's own SQL error is the message's.
func TestMatchUnreachableLeavesTheMessagesFailures(t *testing.T) {
	t.Parallel()
	require.False(t, brake.MatchUnreachable(fmt.Errorf("x: %w", deduplication.ErrClaimInProgress)))
	require.False(t, brake.MatchUnreachable(sluice.Transient(fmt.Errorf("handler: %w", sluice.ErrHeld))))
	require.True(t, brake.MatchUnreachable(sluice.Transient(&sluice.DependencyError{Op: "inbox begin", Err: fmt.Errorf("boom")})))
}
