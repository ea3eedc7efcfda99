package sluicesql_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pg := sqlx.NewDb(nil, "postgres")
	lite := sqlx.NewDb(nil, "sqlite")
	for _, tt := range []struct {
		db   *sqlx.DB
		cfg  sluicesql.InboxConfig
		want string
	}{
		{nil, sluicesql.InboxConfig{}, "sluicesql: NewInbox: the DB is required (a plain *sql.DB: sqlx.NewDb(db, driverName))"},
		{sqlx.NewDb(nil, "mysql"), sluicesql.InboxConfig{}, `driver "mysql" is not supported`},
		{pg, sluicesql.InboxConfig{Table: "inbox; DROP TABLE users"}, "InboxConfig.Table: table \"inbox; DROP TABLE users\": \"inbox; DROP TABLE users\" is not an SQL identifier"},
		{pg, sluicesql.InboxConfig{Table: `in"box`}, "is not an SQL identifier"},
		{pg, sluicesql.InboxConfig{Table: "1inbox"}, "is not an SQL identifier"},
		{pg, sluicesql.InboxConfig{Table: "a.b.c"}, "want name or schema.name"},
		{pg, sluicesql.InboxConfig{Table: strings.Repeat("x", 64)}, "at most 63 bytes"},
		{lite, sluicesql.InboxConfig{Table: "main.inbox"}, "schema.name on PostgreSQL only"},
	} {
		_, err := sluicesql.NewInbox(tt.db, tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
}

func TestSchema(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	s, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".Inbox"})
	require.NoError(t, err)
	sql := s.SchemaSQL()
	require.Contains(t, sql, `CREATE TABLE IF NOT EXISTS "`+schema+`"."Inbox"`)
	require.Contains(t, sql, `PRIMARY KEY (consumer, event_key)`)

	// SchemaSQL is what CreateTable runs: applying it by hand works too.
	_, err = db.Exec(sql)
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'Inbox'`, schema))
	require.Equal(t, 2, n, "the primary key and the processed_at index")
}

func TestPostgresStoreConformance(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		return testenv.SQLStore(t, db, testenv.Schema(t, db)+".inbox")
	})
}

func TestSQLiteStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		return testenv.SQLStore(t, testenv.SQLite(t), "")
	})
}

// A 63-byte table name (PostgreSQL's longest identifier) still gets its
// processed_at index: the index name is made to fit, not truncated onto the
// table's own name.
func TestLongestTableNameGetsItsIndex(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	table := "inbox_" + strings.Repeat("x", 63-len("inbox_"))
	s, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + "." + table})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	require.NoError(t, s.CreateTable(t.Context()), "idempotent")
	var defs []string
	require.NoError(t, db.Select(&defs, `SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2`, schema, table))
	require.Len(t, defs, 2, "the primary key and the processed_at index")
	require.True(t, strings.Contains(defs[0], "(processed_at)") || strings.Contains(defs[1], "(processed_at)"), "%v", defs)
}

// Ping reads the inbox table: it fails once the table is gone (a bad
// migration), as the brake's probe must, and returns within its context on a
// black-holed server, where lib/pq's start-up would wait forever.
func TestStorePing(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	store := testenv.SQLStore(t, db, schema+".inbox")
	require.NoError(t, store.Ping(t.Context()))
	_, err := db.Exec(`DROP TABLE ` + schema + `.inbox`)
	require.NoError(t, err)
	require.Error(t, store.Ping(t.Context()), "the table is gone")

	u, err := url.Parse(testenv.PostgresURL)
	require.NoError(t, err)
	proxy := testenv.StartProxy(t, u.Host)
	proxy.BlackHole()
	u.Host = proxy.Addr()
	holed, err := sqlx.Open("postgres", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = holed.Close() })
	s, err := sluicesql.NewInbox(holed, sluicesql.InboxConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.Ping(ctx), context.DeadlineExceeded)
	proxy.Heal() // the abandoned start-up ends with the reset connection
}

// The inbox runs on a plain *sql.DB (database/sql with lib/pq; a pgxpool
// through pgx's stdlib.OpenDBFromPool) wrapped with its driver's name, as
// on any *sqlx.DB; a driver the stores have no dialect for is named.
func TestNewTakesAPlainSQLDB(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	s, err := sluicesql.NewInbox(sqlx.NewDb(db.DB, "postgres"), sluicesql.InboxConfig{Table: testenv.Schema(t, db) + ".inbox"})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	tx, err := s.Begin(t.Context())
	require.NoError(t, err)
	claimed, err := tx.Claim(t.Context(), "billing", "evt-1")
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, tx.Commit(t.Context()))
	_, err = sluicesql.NewInbox(sqlx.NewDb(db.DB, "mysql"), sluicesql.InboxConfig{})
	require.ErrorContains(t, err, `driver "mysql" is not supported`)
}
