// Package sluicesql is Sluice's one import for an SQL database (PostgreSQL
// through lib/pq or pgx, SQLite through modernc.org/sqlite or
// mattn/go-sqlite3): the three tables Sluice keeps beside your own — the
// inbox (package deduplication/sqlstore), the outbox (Outbox) and
// the replay outcomes (Outcomes) — built by one New, created by one
// Migrate, and the inbox's transaction a handler writes in (TxFromContext).
//
//	stores, err := sluicesql.New(sluicesql.Config{DB: db}) // PostgreSQL or SQLite
//	err = stores.Migrate(ctx)                              // the three tables and their indexes, if missing
//	tx := sluicesql.TxFromContext(msg.Context())           // in a handler: the inbox's transaction
//
// The service package builds its stores with it; the three store packages
// stay for those who wire the stages by hand, and their stores are the
// fields of Stores. It imports no database driver.
package sluicesql
