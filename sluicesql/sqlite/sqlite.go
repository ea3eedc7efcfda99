// Package sqlite opens the pure-Go SQLite database (modernc.org/sqlite) the
// embedded default keeps its inbox and business tables in. Importing it
// registers the "sqlite" database/sql driver: import it only where you use
// SQLite (a second driver registering "sqlite" would panic).
package sqlite

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" driver
)

// busyTimeout is how long Open's connections wait for another
// transaction's write lock.
const busyTimeout = 30 * time.Second

// Open opens (creating if needed) the SQLite database file at path
// with the pure-Go driver, set up for an inbox shared by concurrent
// handlers: write-ahead logging, a busy timeout of 30 s,
// and transactions that take the write lock when they begin (BEGIN
// IMMEDIATE), so two deliveries never deadlock upgrading a read lock.
func Open(ctx context.Context, path string) (*sqlx.DB, error) {
	db, err := sqlx.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	return db, nil
}

// DSN is the data source name Open opens path with, for the "sqlite"
// driver: the settings Open describes.
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}
