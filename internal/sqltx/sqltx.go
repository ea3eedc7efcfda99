// Package sqltx is the SQL inbox's unit of work (sluicesql.Inbox) as the
// other SQL stores of the module read it — the outbox writes its rows in
// it, the replay outcomes record processed in it — without importing
// sluicesql, which imports them to build its Stores.
package sqltx

import (
	"context"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/internal/sqlstate"
	"github.com/sluicemq/sluice/unitofwork"
)

// Unit is the SQL inbox's unit of work: an SQL transaction.
type Unit interface {
	unitofwork.Tx
	SQLX() *sqlx.Tx
}

// Of returns the SQL transaction of tx, a unit of work the SQL inbox began,
// or nil for another store's.
func Of(tx unitofwork.Tx) *sqlx.Tx {
	if u, ok := tx.(Unit); ok {
		return u.SQLX()
	}
	return nil
}

// FromContext returns the SQL inbox's transaction of the delivery being
// handled, or nil outside one.
func FromContext(ctx context.Context) *sqlx.Tx { return Of(unitofwork.FromContext(ctx)) }

// Mark, embedded in the SQL inbox under an unexported name, tells it apart
// from any other store (InboxDriver) without a method in its documentation.
type Mark struct{ driver string }

// NewMark returns the mark of an SQL inbox on a database of driver.
func NewMark(driver string) Mark { return Mark{driver: driver} }

func (m Mark) sqlInboxDriver() string { return m.driver }

// InboxDriver returns the driver name of store's database when store is
// the SQL inbox.
func InboxDriver(store any) (string, bool) {
	if m, ok := store.(interface{ sqlInboxDriver() string }); ok {
		return m.sqlInboxDriver(), true
	}
	return "", false
}

// Aborted reports whether err is the error of a statement refused because
// an earlier one aborted the transaction (PostgreSQL's 25P02), or of a
// commit refused for that reason — lib/pq's ErrInFailedTransaction, pgx's
// ErrTxCommitRollback (matched by their text: the module imports no
// driver), or a deferred constraint violated at commit (class 23): nothing
// more can be written in it. A lost connection or a serialization failure
// at commit is not one.
func Aborted(err error) bool {
	if state, ok := sqlstate.Of(err); ok {
		return state == "25P02" || strings.HasPrefix(state, "23")
	}
	msg := err.Error()
	return strings.Contains(msg, "in a failed transaction") || strings.Contains(msg, "commit unexpectedly resulted in rollback")
}
