// Package nodriver_test is a host program that mounts the console and
// links package dlq, and nothing else of Sluice's: it checks that they
// register no database/sql driver as a side effect. A driver is the host
// program's choice (lib/pq, pgx, a MySQL driver…); the sluice CLI links its
// own (sluicesql/postgres). Before, dlq imported lib/pq (and
// sluicesql/postgres), whose init registered "postgres" in every program
// that mounted the console.
package nodriver_test

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/dlq"
)

func TestMountingTheConsoleRegistersNoDatabaseDriver(t *testing.T) {
	t.Parallel()
	_ = console.New // linked: the console and, through it, dlq
	_ = dlq.Open
	require.Empty(t, sql.Drivers(), "database/sql drivers registered by linking console and dlq")
}
