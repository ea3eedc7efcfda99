package mariadbstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql" // the MariaDB driver
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/examples/mariadbstore"
	"github.com/sluicemq/sluice/internal/localenv"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/replay/replaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mariaDB opens the test database and a table name of t's own, dropped at
// the end. A test fails, not skips, without MariaDB: make services starts it.
func mariaDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	db, err := sql.Open("mysql", localenv.Get("SLUICE_TEST_MARIADB_DSN", localenv.MariaDBDSN))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.PingContext(t.Context()), "MariaDB (run `make services`)")
	table := testenv.Name("inbox")
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+", "+table+"_biz") })
	return db, table
}

func TestConformance(t *testing.T) {
	t.Parallel()
	db, _ := mariaDB(t)
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		table := testenv.Name("inbox")
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
		s, err := mariadbstore.New(mariadbstore.Config{DB: db, Table: table})
		require.NoError(t, err)
		require.NoError(t, s.CreateTable(t.Context()))
		return s
	})
}

// The handler writes through the store's transaction, reached with the
// store's own accessor: three deliveries of one event, one business row; a
// failed run leaves nothing.
func TestHandlerWritesThroughTheStoresTransaction(t *testing.T) {
	t.Parallel()
	db, table := mariaDB(t)
	s, err := mariadbstore.New(mariadbstore.Config{DB: db, Table: table})
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(t.Context()))
	_, err = db.Exec("CREATE TABLE " + table + "_biz (event_key VARCHAR(64) NOT NULL) ENGINE=InnoDB")
	require.NoError(t, err)
	d, err := deduplication.New(deduplication.Config{Store: s, Consumer: "inventory"})
	require.NoError(t, err)
	fail := true
	handler := d(func(msg *message.Message) ([]*message.Message, error) {
		tx := mariadbstore.TxFromContext(msg.Context())
		if tx == nil {
			return nil, fmt.Errorf("no transaction in the context")
		}
		if _, err := tx.ExecContext(msg.Context(), "INSERT INTO "+table+"_biz VALUES (?)", msg.Metadata.Get(sluice.EventIDKey)); err != nil {
			return nil, err
		}
		if fail {
			fail = false
			return nil, sluice.Transient(fmt.Errorf("stock service: timeout"))
		}
		return nil, nil
	})
	for range 4 {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(sluice.EventIDKey, "evt-1")
		m.SetContext(t.Context())
		_, _ = handler(m)
	}
	var rows, claims int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM "+table+"_biz").Scan(&rows))
	require.NoError(t, db.QueryRow("SELECT count(*) FROM "+table).Scan(&claims))
	require.Equal(t, 1, rows, "the failed run was rolled back, the later duplicates skipped")
	require.Equal(t, 1, claims)
}

// The ledger passes the replay ledger conformance suite: what
// `sluice dlq replay` needs of the outcome records, kept beside the inbox on
// MariaDB.
func TestLedgerConformance(t *testing.T) {
	t.Parallel()
	db, _ := mariaDB(t)
	replaytest.Run(t, func(t *testing.T) ledger.Ledger {
		table := testenv.Name("replay")
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
		l, err := mariadbstore.NewLedger(db, table)
		require.NoError(t, err)
		require.NoError(t, l.CreateTable(t.Context()))
		return l
	})
	_, err := mariadbstore.NewLedger(db, "no such; table")
	require.ErrorContains(t, err, "not an identifier")
}
