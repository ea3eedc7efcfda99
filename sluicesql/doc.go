// Package sluicesql is Sluice's one import for an SQL database (PostgreSQL
// through lib/pq or pgx, SQLite through modernc.org/sqlite or
// mattn/go-sqlite3): the tables Sluice keeps beside your own — the inbox
// (Inbox), the outbox (Outbox), the replay outcomes (Outcomes) and, on
// PostgreSQL, the ordering stage's (Orders) — built by one New, created by
// one Migrate, and the inbox's transaction a handler writes in
// (TxFromContext).
//
//	stores, err := sluicesql.New(db, sluicesql.Config{}) // PostgreSQL or SQLite
//	err = stores.Migrate(ctx)                              // the tables and their indexes, if missing
//	tx := sluicesql.TxFromContext(msg.Context())           // in a handler: the inbox's transaction
//
// The inbox's store is here (Inbox, NewInbox: each delivery's unit of work
// is an SQL transaction, so the inbox record and the handler's writes commit
// or roll back together), with the Pruner that deletes old inbox and
// outcome records in bounded batches. The service package builds its stores
// with New; the stores are the fields of Stores, and each has its own
// constructor for those who wire the stages by hand. It imports no database
// driver: register one yourself (lib/pq, pgx's stdlib), or open the pure-Go
// SQLite with package sluicesql/sqlite and a bounded lib/pq pool with
// sluicesql/postgres.
package sluicesql
