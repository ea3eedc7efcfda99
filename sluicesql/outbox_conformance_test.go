package sluicesql_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox/outboxtest"
	"github.com/sluicemq/sluice/sluicesql"
)

// The SQL outbox passes the outbox conformance suite on PostgreSQL and on
// SQLite, beside the SQL inbox.
func TestOutboxConformance(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testenv.Postgres(t)
		outboxtest.Run(t, func(t *testing.T) outboxtest.Stores {
			schema := testenv.Schema(t, pg)
			in := testenv.SQLStore(t, pg, schema+".inbox")
			out, err := sluicesql.NewOutbox(pg, sluicesql.OutboxConfig{Table: schema + ".outbox"})
			require.NoError(t, err)
			require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), out))
			return outboxtest.Stores{Inbox: in, Outbox: out}
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		outboxtest.Run(t, func(t *testing.T) outboxtest.Stores {
			db := testenv.SQLite(t)
			in, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{})
			require.NoError(t, err)
			require.NoError(t, in.CreateTable(t.Context()))
			out, err := sluicesql.NewOutbox(db, sluicesql.OutboxConfig{})
			require.NoError(t, err)
			require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), out))
			return outboxtest.Stores{Inbox: in, Outbox: out}
		})
	})
}
