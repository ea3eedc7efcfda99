package sluicesql

import "github.com/sluicemq/sluice/internal/sqlstate"

// SQLState returns the SQLSTATE of err, and whether it has one, for a
// classifier rule or a brake matcher of your own (brake.Config.Match:
// strings.HasPrefix(state, "08") for the connection exceptions): what
// sluice's default Classifier and sluice.Unreachable read. It reads, in
// this order:
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
func SQLState(err error) (string, bool) { return sqlstate.Of(err) }
