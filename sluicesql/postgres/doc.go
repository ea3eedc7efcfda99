// Package postgres opens a PostgreSQL pool (lib/pq) whose every dial and
// every wait is bounded, for Sluice's stores and your handlers' writes:
//
//	db, err := postgres.Open(postgres.Config{DSN: os.Getenv("DATABASE_URL")})
//	db.SetMaxOpenConns(20) // your consumer's in-flight window and a margin
//	stores, err := sluicesql.New(db, sluicesql.Config{})
//
// A pool opened with sqlx.Open("postgres", dsn) does not recover from a
// network fault that swallows packets rather than refusing them: lib/pq
// waits forever for a server's start-up answer unless the DSN has
// connect_timeout, and a statement whose context has ended stays blocked on
// a read that never returns (the cancel request it sends cannot get
// through, or is answered by a server that has forgotten the session), so
// each such connection keeps its place in a capped pool for good and, once
// the pool is full of them, nothing moves after the network heals. Open's
// pool bounds the start-up by Config.ConnectTimeout, closes a connection
// whose statement is still unanswered Config.CancelGrace after its context
// ended (and a COMMIT or ROLLBACK unanswered after Config.CommitTimeout),
// refuses to hand out again a connection that sat idle across such a
// failure (it may be stalled the same way: the pool opens a new one), and
// turns on TCP keepalive and TCP_USER_TIMEOUT so that the kernel ends a
// socket whose peer is gone. docs/deduplication.md, "A store that hangs",
// says what recovers and in how long.
//
// The stores take any pool (sluicesql.New's db); this package is the one
// of the libraries' that links lib/pq for it.
package postgres
