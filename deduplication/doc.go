// Package deduplication is Sluice's inbox: it makes a consumer's effects
// happen once per business event although the broker delivers at least once.
//
// For each delivery the inbox stage (New) takes a key from the message — a
// business event id, never the broker's message id (Config.Key: the root's
// sluice.KeyFromMetadata, KeyFromJSON, KeyPrefix, KeyJoin) — opens a
// transaction, claims (consumer, key) in its Store (the SQL store: INSERT
// ... ON CONFLICT DO NOTHING into the inbox table), and runs the handler inside the same unit
// of work (package unitofwork: unitofwork.FromContext; sluicesql.TxFromContext
// for the SQL transaction). The
// transaction commits when the handler succeeds or rejects the message, and
// rolls back otherwise; the router acks only after the commit. A redelivery
// of a committed key is acked without running the handler. A concurrent
// delivery of the same key waits on the inbox's primary key until the first
// transaction ends, then skips (commit) or proceeds (rollback).
//
// What each outcome does:
//
//	handler result        inbox + business writes   message
//	nil                   committed                 acked
//	sluice.Reject(err)    committed                 acked (by middleware.Classify)
//	any other error       rolled back               nacked or retried by outer stages
//	panic                 rolled back               (Recoverer turns it into an error)
//	commit fails          rolled back               Transient failure: not acked
//	no usable key         nothing opened            Poison failure, handler not run
//	key already committed nothing written           acked, counted as a duplicate
//
// Stores live at the edges, so that importing this package links no
// database driver: sluicesql.Inbox on PostgreSQL (lib/pq or pgx) or SQLite
// (sluicesql/sqlite, pure Go, the embedded default); sluiceredis.Inbox,
// which cannot join the business transaction and so guarantees less (see
// its documentation); MemoryStore here, for tests. Any Store must pass
// deduplicationtest.Run; a store of your own gives its handlers its unit of
// work by type-asserting unitofwork.FromContext's result (see
// examples/mariadbstore). sluicesql.Pruner deletes old records in bounded
// batches.
//
// The inbox table (PostgreSQL; sluicesql.Inbox.SchemaSQL prints it for a
// given table name):
//
//	CREATE TABLE IF NOT EXISTS "sluice_inbox" (
//		consumer     TEXT        NOT NULL,
//		event_key    TEXT        NOT NULL,
//		processed_at TIMESTAMPTZ NOT NULL,
//		PRIMARY KEY (consumer, event_key)
//	);
//	CREATE INDEX IF NOT EXISTS "sluice_inbox_processed_at" ON "sluice_inbox" (processed_at);
package deduplication
