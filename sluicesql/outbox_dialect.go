package sluicesql

import (
	"fmt"
	"time"
)

// dialect holds the SQL that differs between databases.
type outboxDialect struct {
	name    string
	table   string // %s is the table
	schemas bool
	// values returns one row's placeholders for INSERT, the first
	// argument being number n+1.
	values  func(n int) string
	unlease string
	// now is the time now, on the clock Due compares with.
	now string
	// oldestAge selects the oldest pending row's age as age, in seconds,
	// on the database's clock; empty where that is the process's.
	oldestAge string
	// addDead adds dead_at to a table created before it (%s is the
	// table); empty on SQLite, which cannot say IF NOT EXISTS.
	addDead string
	// after is the time a wait (waitArg's argument) from now, on the
	// clock Due compares with.
	after    string
	waitArg  func(time.Duration) any
	readTime func(any) (time.Time, error)
}

var outboxPostgres = outboxDialect{
	name: "postgres",
	table: `CREATE TABLE IF NOT EXISTS %s (
	id              BIGSERIAL   PRIMARY KEY,
	topic           TEXT        NOT NULL,
	message_id      TEXT        NOT NULL,
	metadata        BYTEA       NOT NULL,
	payload         BYTEA       NOT NULL,
	created_at      TIMESTAMPTZ NOT NULL,
	attempts        INTEGER     NOT NULL DEFAULT 0,
	next_attempt_at TIMESTAMPTZ NOT NULL,
	last_error      TEXT,
	dead_at         TIMESTAMPTZ
)`,
	schemas: true,
	values: func(n int) string {
		return fmt.Sprintf("($%d, $%d, $%d, $%d, clock_timestamp(), clock_timestamp())", n+1, n+2, n+3, n+4)
	},
	after:     `clock_timestamp() + make_interval(secs => ?)`,
	now:       `clock_timestamp()`,
	oldestAge: `, EXTRACT(EPOCH FROM clock_timestamp() - min(CASE WHEN dead_at IS NULL THEN created_at END))::float8 AS age`,
	addDead:   `ALTER TABLE %s ADD COLUMN IF NOT EXISTS dead_at TIMESTAMPTZ`,
	waitArg:   func(d time.Duration) any { return d.Seconds() },
	readTime: func(v any) (time.Time, error) {
		t, ok := v.(time.Time)
		if !ok {
			return time.Time{}, fmt.Errorf("sluicesql: outbox: a time column read as %T", v)
		}
		return t, nil
	},
}

// sqlite keeps times as Unix microseconds, as the inbox does.
var outboxSQLite = outboxDialect{
	name: "sqlite",
	table: `CREATE TABLE IF NOT EXISTS %s (
	id              INTEGER PRIMARY KEY AUTOINCREMENT,
	topic           TEXT    NOT NULL,
	message_id      TEXT    NOT NULL,
	metadata        BLOB    NOT NULL,
	payload         BLOB    NOT NULL,
	created_at      INTEGER NOT NULL,
	attempts        INTEGER NOT NULL DEFAULT 0,
	next_attempt_at INTEGER NOT NULL,
	last_error      TEXT,
	leased_until    INTEGER NOT NULL DEFAULT 0,
	dead_at         INTEGER
)`,
	values: func(int) string {
		return "(?, ?, ?, ?, CAST(unixepoch('subsec') * 1000000 AS INTEGER), CAST(unixepoch('subsec') * 1000000 AS INTEGER))"
	},
	unlease: `, leased_until = 0`,
	after:   `?`, // Due compares with the relay's clock on SQLite
	now:     `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`,
	waitArg: func(d time.Duration) any { return time.Now().Add(d).UnixMicro() },
	readTime: func(v any) (time.Time, error) {
		us, ok := v.(int64)
		if !ok {
			return time.Time{}, fmt.Errorf("sluicesql: outbox: a time column read as %T", v)
		}
		return time.UnixMicro(us), nil
	},
}

var outboxDialects = map[string]outboxDialect{
	"postgres": outboxPostgres,
	"pgx":      outboxPostgres,
	"sqlite":   outboxSQLite,
	"sqlite3":  outboxSQLite,
}
