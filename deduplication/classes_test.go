package deduplication_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/sluicesql"
)

func requirePQ(t *testing.T, err error, state string) {
	t.Helper()
	var pqErr *pq.Error
	require.ErrorAs(t, err, &pqErr)
	require.Equal(t, state, string(pqErr.Code), "%v", err)
}

// SQLSTATE class 42 from the handler's statements — an undefined column
// (42703) or table (42P01) — is a bug in the handler: Poison, isolated at
// once (fix, then replay), not 35 minutes of Transient ladder first.
func TestHandlerClass42IsPoisonByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := sluice.DefaultClassifier()
	for state, stmt := range map[string]string{
		"42703": `UPDATE %s.reservations SET nope = 1`,
		"42P01": `INSERT INTO %s.no_such_table VALUES (1)`,
	} {
		h := b.dedup(t, "inventory-"+state)(func(msg *message.Message) ([]*message.Message, error) {
			_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), fmt.Sprintf(stmt, b.schema))
			return nil, fmt.Errorf("reserving: %w", err)
		})
		msg := event("evt-" + state)
		_, err := h(msg)
		requirePQ(t, err, state)
		_, isDependency := errors.AsType[*sluice.DependencyError](err)
		require.False(t, isDependency, "the handler's own statement")
		require.Equal(t, sluice.ClassPoison, c.Classify(err), state)
	}
}

// The inbox table missing fails the inbox's own claim with the same class
// 42 (42P01): that is the dependency's failure, not the message's — a
// DependencyError, Transient, which the brake counts.
func TestMissingInboxTableIsTheDependencys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, err := sluicesql.NewInbox(b.db, sluicesql.InboxConfig{Table: b.schema + ".missing_inbox"}) // no CreateTable
	require.NoError(t, err)
	d, err := deduplication.New(deduplication.Config{Store: store, Consumer: "inventory"})
	require.NoError(t, err)
	_, err = d(b.reserve(nil))(event("evt-1"))
	require.Zero(t, b.handled.Load(), "the handler does not run")
	requirePQ(t, err, "42P01")
	de, ok := errors.AsType[*sluice.DependencyError](err)
	require.True(t, ok, "%v", err)
	require.Contains(t, de.Op, "claim")
	require.True(t, brake.MatchUnreachable(err))
	c, err := sluice.NewClassifier(sluice.ClassifierConfig{Default: sluice.ClassPoison})
	require.NoError(t, err)
	require.Equal(t, sluice.ClassTransient, c.Classify(de), "the dependency's, by the default rules")
	require.Equal(t, sluice.ClassTransient, c.Classify(fmt.Errorf("inbox: %w", de)))
	require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(de))
}
