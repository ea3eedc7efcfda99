package sqlstore_test

import (
	"os"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/outbox/sqlstore"
)

// docs/outbox.md shows the PostgreSQL table as CreateTable makes it.
func TestTheDocumentedSchemaIsTheStoresOwn(t *testing.T) {
	t.Parallel()
	s, err := sqlstore.New(sqlstore.Config{DB: sqlx.NewDb(nil, "postgres")})
	require.NoError(t, err)
	doc, err := os.ReadFile("../../docs/outbox.md")
	require.NoError(t, err)
	require.Contains(t, string(doc), strings.TrimSpace(s.SchemaSQL()))
}
