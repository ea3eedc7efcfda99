package mariadbstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/examples/mariadbstore"
	"github.com/sluicemq/sluice/sluicesql"
)

// mysqlError requires err to be the MariaDB error number with SQLSTATE state.
func mysqlError(t *testing.T, err error, number uint16, state string) {
	t.Helper()
	var me *mysql.MySQLError
	require.ErrorAs(t, err, &me)
	require.Equal(t, number, me.Number, "%v", err)
	require.Equal(t, state, string(me.SQLState[:]), "%v", err)
}

// classTable creates a table of t's own with the rows 1 and 2.
func classTable(t *testing.T) (*sql.DB, string) {
	t.Helper()
	db, table := mariaDB(t)
	_, err := db.ExecContext(t.Context(), "CREATE TABLE "+table+" (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB")
	require.NoError(t, err)
	_, err = db.ExecContext(t.Context(), "INSERT INTO "+table+" VALUES (1, 0), (2, 0)")
	require.NoError(t, err)
	return db, table
}

// lockConn returns a connection of db of its own whose lock waits end
// after a second.
func lockConn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	conn, err := db.Conn(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.ExecContext(t.Context(), "SET SESSION innodb_lock_wait_timeout = 1")
	require.NoError(t, err)
	return conn
}

// A handler's bug in its statements — an undefined column (1054, 42S22), a
// syntax error (1064, 42000) — and an integrity violation (1062, 23000)
// fail the same way on every retry: Poison by default, as PostgreSQL's
// classes 42 and 23 are. Before, go-sql-driver's errors were not read and
// went through the whole Transient ladder.
func TestMariaDBHandlerErrorsArePoison(t *testing.T) {
	t.Parallel()
	db, table := classTable(t)
	c := sluice.DefaultClassifier()
	for _, tt := range []struct {
		stmt   string
		number uint16
		state  string
	}{
		{"SELECT nope FROM " + table, 1054, "42S22"},
		{"SELEC v FROM " + table, 1064, "42000"},
		{"INSERT INTO " + table + " VALUES (1, 1)", 1062, "23000"},
		{"SELECT v FROM " + table + "_none", 1146, "42S02"},
	} {
		_, err := db.ExecContext(t.Context(), tt.stmt)
		mysqlError(t, err, tt.number, tt.state)
		state, ok := sluicesql.SQLState(err)
		require.True(t, ok)
		require.Equal(t, tt.state, state)
		require.Equal(t, sluice.ClassPoison, c.Classify(err), "%v", err)
	}
}

// A lock wait timeout (1205) is reported with the generic SQLSTATE HY000:
// read by its number, it is Transient — a rule, not the Default.
func TestMariaDBLockWaitTimeoutIsTransient(t *testing.T) {
	t.Parallel()
	db, table := classTable(t)
	holder, err := db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback() })
	_, err = holder.ExecContext(t.Context(), "UPDATE "+table+" SET v = 1 WHERE id = 1")
	require.NoError(t, err)

	_, err = lockConn(t, db).ExecContext(t.Context(), "UPDATE "+table+" SET v = 2 WHERE id = 1")
	mysqlError(t, err, 1205, "HY000")
	require.NoError(t, holder.Rollback())

	state, _ := sluicesql.SQLState(err)
	require.Equal(t, "55P03", state, "as PostgreSQL's lock_timeout")
	c, cerr := sluice.NewClassifier(sluice.ClassifierConfig{Default: sluice.ClassPoison})
	require.NoError(t, cerr)
	require.Equal(t, sluice.ClassTransient, c.Classify(err))
	require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(err))
}

// Two transactions that lock rows 1 and 2 and then each other's: whichever
// waits second closes the cycle, and InnoDB's deadlock detection rolls one
// back with 1213 (40001) at once, whatever the order. Transient.
func TestMariaDBDeadlockIsTransient(t *testing.T) {
	t.Parallel()
	db, table := classTable(t)
	ctx := t.Context()
	a, b := lockConn(t, db), lockConn(t, db)
	txA, err := a.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = txA.Rollback() })
	txB, err := b.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = txB.Rollback() })
	_, err = txA.ExecContext(ctx, "UPDATE "+table+" SET v = 1 WHERE id = 1")
	require.NoError(t, err)
	_, err = txB.ExecContext(ctx, "UPDATE "+table+" SET v = 1 WHERE id = 2")
	require.NoError(t, err)

	errA := make(chan error, 1)
	go func() {
		_, err := txA.ExecContext(ctx, "UPDATE "+table+" SET v = 2 WHERE id = 2")
		if err != nil {
			_ = txA.Rollback() // the victim: releases row 1 for B
		}
		errA <- err
	}()
	_, errB := txB.ExecContext(ctx, "UPDATE "+table+" SET v = 2 WHERE id = 1")
	if errB != nil {
		_ = txB.Rollback() // the victim: releases row 2 for A
	}
	deadlock := errors.Join(<-errA, errB)
	mysqlError(t, deadlock, 1213, "40001")
	c, err := sluice.NewClassifier(sluice.ClassifierConfig{Default: sluice.ClassPoison})
	require.NoError(t, err)
	require.Equal(t, sluice.ClassTransient, c.Classify(deadlock), "%v", deadlock)
}

// The inbox table missing (1146, 42S02: class 42) on the inbox's own claim
// is the dependency's failure, not the message's: a DependencyError,
// Transient, counted by the brake — while the same class from the handler's
// statements is Poison.
func TestMariaDBMissingInboxTableIsTheDependencys(t *testing.T) {
	t.Parallel()
	db, table := mariaDB(t)
	s, err := mariadbstore.New(mariadbstore.Config{DB: db, Table: table}) // no CreateTable
	require.NoError(t, err)
	d, err := deduplication.New(deduplication.Config{Store: s, Consumer: "inventory"})
	require.NoError(t, err)
	ran := false
	handler := d(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	m.SetContext(t.Context())
	_, err = handler(m)
	require.False(t, ran)
	mysqlError(t, err, 1146, "42S02")
	de, ok := errors.AsType[*sluice.DependencyError](err)
	require.True(t, ok, "%v", err)
	require.True(t, brake.MatchUnreachable(err))
	c, cerr := sluice.NewClassifier(sluice.ClassifierConfig{Default: sluice.ClassPoison})
	require.NoError(t, cerr)
	require.Equal(t, sluice.ClassTransient, c.Classify(err))
	require.Equal(t, sluice.ClassTransient, c.Classify(de), "the dependency's even without the inbox's Transient wrapper")
	_, err = db.ExecContext(context.Background(), "SELECT 1 FROM "+table)
	require.Equal(t, sluice.ClassPoison, c.Classify(err), "the same class from a handler's statement")
}
