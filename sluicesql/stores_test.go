package sluicesql_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// One Migrate creates the tables (the ordering store's too, on PostgreSQL); run again, and from several
// instances at once, it changes nothing and fails nothing.
func TestMigrateCreatesTheTablesOnce(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 { // instances starting together
		wg.Go(func() {
			s, err := sluicesql.New(db, sluicesql.Config{Schema: schema})
			if err == nil {
				err = s.Migrate(t.Context())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var tables []string
	require.NoError(t, db.Select(&tables, `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name`, schema))
	require.Equal(t, []string{"sluice_inbox", "sluice_order_held", "sluice_order_keys", "sluice_outbox", "sluice_replay", "sluice_replay_runs"}, tables,
		"on PostgreSQL, the ordering store's two tables too")
	var indexes int
	require.NoError(t, db.Get(&indexes, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname LIKE '%_at'`, schema))
	require.Equal(t, 3, indexes, "the inbox's processed_at and the outcomes' updated_at, which the pruners read, and the runs' started_at, which the console reads")

	s, err := sluicesql.New(db, sluicesql.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()), "idempotent")
	require.Equal(t, schema+".sluice_outbox", s.Outbox.Name())
	require.Same(t, db, s.DB())
}

func TestMigrateOnSQLite(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	s, err := sluicesql.New(db, sluicesql.Config{Inbox: sluicesql.InboxConfig{Table: "inbox"}, Outbox: sluicesql.OutboxConfig{Table: "outbox"}, Outcomes: sluicesql.OutcomesConfig{Table: "outcomes"}})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()))
	require.NoError(t, s.Migrate(t.Context()))
	var tables []string
	require.NoError(t, db.Select(&tables, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`))
	require.Equal(t, []string{"inbox", "outbox", "outcomes", "outcomes_runs"}, tables) // the replay runs beside their outcomes (ledger.Runs)
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := sluicesql.New(nil, sluicesql.Config{})
	require.ErrorContains(t, err, "sluicesql: New: the DB is required")
	_, err = sluicesql.New(testenv.SQLite(t), sluicesql.Config{Schema: "s"})
	require.ErrorContains(t, err, "Config.Schema is PostgreSQL's")
	_, err = sluicesql.New(testenv.SQLite(t), sluicesql.Config{Outbox: sluicesql.OutboxConfig{Table: "a.b"}})
	require.ErrorContains(t, err, "Config.Outbox.Table")
	_, err = sluicesql.New(testenv.SQLite(t), sluicesql.Config{Inbox: sluicesql.InboxConfig{Table: "in box"}})
	require.ErrorContains(t, err, "the inbox (Config.Inbox, Config.Schema)")
}
