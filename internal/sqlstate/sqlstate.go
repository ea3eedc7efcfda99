// Package sqlstate reads the SQLSTATE of a database error, for the root's
// default Classifier and Unreachable, the brake's matchers and the stores,
// without importing a driver. sluicesql.SQLState is its public face.
package sqlstate

import (
	"errors"
	"strings"
)

// stater is implemented by lib/pq's *pq.Error and pgx's *pgconn.PgError;
// Of also reads go-sql-driver/mysql's *MySQLError, which has none.
type stater interface {
	error
	SQLState() string
}

// Of returns the SQLSTATE of err, and whether it has one. It reads, in this
// order:
//   - the first error in err's chain with a SQLState() string method
//     (lib/pq's *pq.Error, pgx's *pgconn.PgError, an adapter of your own);
//   - else the first of the chain's first 64 errors that is a struct, or a
//     pointer to one, with the exported fields Number uint16 and SQLState
//     [5]byte: go-sql-driver/mysql's *MySQLError, read by reflection so
//     that this package imports no driver. For the error numbers whose
//     SQLSTATE says too little — 1040 and 1203 (too many connections,
//     08004), 1205 (lock wait timeout, reported as HY000: 55P03, as
//     PostgreSQL's lock_timeout), 1213 (deadlock, 40001), 2006 and 2013
//     (server gone or lost, 08S01) — it returns the SQLSTATE given in parentheses;
//     for the others the one the server reported, none if it reported none.
func Of(err error) (string, bool) {
	if s, ok := errors.AsType[stater](err); ok {
		return s.SQLState(), true
	}
	return mysqlSQLState(err)
}

// Unreachable reports the SQLSTATEs of a database that cannot serve
// anyone right now: a connection exception (class 08), insufficient
// resources (class 53: too many connections, disk full, out of memory), a
// server shutting down or starting up (57P01-57P03).
func Unreachable(state string) bool {
	switch state {
	case "57P01", "57P02", "57P03":
		return true
	}
	return strings.HasPrefix(state, "08") || strings.HasPrefix(state, "53")
}
