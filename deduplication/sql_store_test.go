package deduplication_test

import (
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
)

func TestNewSQLStoreValidates(t *testing.T) {
	t.Parallel()
	pg := sqlx.NewDb(nil, "postgres")
	lite := sqlx.NewDb(nil, "sqlite")
	for _, tt := range []struct {
		cfg  deduplication.SQLConfig
		want string
	}{
		{deduplication.SQLConfig{}, "SQLConfig.DB is required"},
		{deduplication.SQLConfig{DB: sqlx.NewDb(nil, "mysql")}, `driver "mysql" is not supported`},
		{deduplication.SQLConfig{DB: pg, Table: "inbox; DROP TABLE users"}, "is not an SQL identifier"},
		{deduplication.SQLConfig{DB: pg, Table: `in"box`}, "is not an SQL identifier"},
		{deduplication.SQLConfig{DB: pg, Table: "1inbox"}, "is not an SQL identifier"},
		{deduplication.SQLConfig{DB: pg, Table: "a.b.c"}, "want name or schema.name"},
		{deduplication.SQLConfig{DB: pg, Table: strings.Repeat("x", 64)}, "at most 63 bytes"},
		{deduplication.SQLConfig{DB: lite, Table: "main.inbox"}, "schema.name on PostgreSQL only"},
	} {
		_, err := deduplication.NewSQLStore(tt.cfg)
		require.ErrorContains(t, err, tt.want)
		require.ErrorContains(t, err, "SQLConfig.")
	}
}

func TestSQLStoreSchema(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	s, err := deduplication.NewSQLStore(deduplication.SQLConfig{DB: db, Table: schema + ".Inbox"})
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
