package sqldb_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/sqldb"
	"github.com/sluicemq/sluice/internal/testenv"
)

// Strings reach PostgreSQL as they are — quotes, backslashes, commas,
// braces, spaces, "NULL" — through the text[] literal TextArray makes, cast
// as its users cast it: the event ids a dlq restore from a table selects
// (which replaced lib/pq's pq.Array: dlq links no driver), the keys of the
// inbox's batch claim.
func TestTextArrayCarriesEventIDsAsTheyAre(t *testing.T) {
	t.Parallel()
	ids := []string{`e"1`, `e\2`, "e,3", "{e4}", " e 5 ", "", "NULL", "é6"}
	var got []string
	require.NoError(t, testenv.Postgres(t).Select(&got, `SELECT unnest(CAST($1 AS TEXT)::TEXT[])`, sqldb.TextArray(ids)))
	require.Equal(t, ids, got)
}
