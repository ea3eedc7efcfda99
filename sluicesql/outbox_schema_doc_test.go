package sluicesql_test

import (
	"os"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/sluicesql"
)

// docs/outbox.md shows the PostgreSQL table as CreateTable makes it.
func TestTheDocumentedSchemaIsTheStoresOwn(t *testing.T) {
	t.Parallel()
	s, err := sluicesql.NewOutbox(sqlx.NewDb(nil, "postgres"), sluicesql.OutboxConfig{})
	require.NoError(t, err)
	doc, err := os.ReadFile("../docs/outbox.md")
	require.NoError(t, err)
	require.Contains(t, string(doc), strings.TrimSpace(sluicesql.OutboxSchemaSQL(s)))
}
