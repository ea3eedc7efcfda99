package sluicetest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

// openSQLite opens the kit's SQLite database at path (sqlite.Open's
// settings) through a driver that fails the commit of an inbox transaction
// when failCommit says so, and writes the inbox's processed_at from now
// (the virtual clock's).
func openSQLite(ctx context.Context, path string, failCommit func() bool, now func() time.Time) (*sqlx.DB, error) {
	probe, err := sql.Open("sqlite", sqlite.DSN(path))
	if err != nil {
		return nil, err
	}
	drv := probe.Driver()
	_ = probe.Close()
	db := sqlx.NewDb(sql.OpenDB(connector{drv: drv, dsn: sqlite.DSN(path), failCommit: failCommit, now: now}), "sqlite")
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("opening the kit's SQLite database: %w", err)
	}
	return db, nil
}

type connector struct {
	drv        driver.Driver
	dsn        string
	failCommit func() bool
	now        func() time.Time
}

func (c connector) Connect(context.Context) (driver.Conn, error) {
	inner, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: inner, failCommit: c.failCommit, now: c.now}, nil
}

func (c connector) Driver() driver.Driver { return c.drv }

// conn forwards to the SQLite connection and marks the transaction in
// which the inbox claims a key.
type conn struct {
	driver.Conn
	failCommit func() bool
	now        func() time.Time
	mu         sync.Mutex
	tx         *tx
}

var (
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
)

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	var inner driver.Tx
	var err error
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		inner, err = b.BeginTx(ctx, opts)
	} else {
		inner, err = c.Conn.Begin() //nolint:staticcheck // the driver's only way
	}
	if err != nil {
		return nil, err
	}
	t := &tx{Tx: inner, c: c}
	c.mu.Lock()
	c.tx = t
	c.mu.Unlock()
	return t, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.tx != nil && isInboxClaim(query) {
		c.tx.inbox = true
	}
	query = c.clocked(query)
	if e, ok := c.Conn.(driver.ExecerContext); ok {
		return e.ExecContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := c.Conn.(driver.QueryerContext); ok {
		return q.QueryContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.tx != nil && isInboxClaim(query) {
		c.tx.inbox = true
	}
	query = c.clocked(query)
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

func (c *conn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *conn) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *conn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// sqliteNow is how the SQL inbox store writes processed_at on SQLite
// (sluicesql.Inbox); TestTheInboxRecordsVirtualTime fails when it
// changes.
const sqliteNow = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"

// clocked returns the inbox's claim with the database's clock replaced by
// the kit's; any other statement as it is (the outbox's times compare with
// the relay's real clock).
func (c *conn) clocked(query string) string {
	if !isInboxClaim(query) || !strings.Contains(query, sqliteNow) {
		return query
	}
	return strings.ReplaceAll(query, sqliteNow, strconv.FormatInt(c.now().UnixMicro(), 10))
}

// isInboxClaim reports whether query writes the inbox's record.
func isInboxClaim(query string) bool {
	q := strings.TrimSpace(query)
	return len(q) > 6 && strings.EqualFold(q[:6], "INSERT") && strings.Contains(q, "sluice_inbox")
}

// tx fails its commit, rolling back, when it claimed an inbox key and a
// commit fault is armed.
type tx struct {
	driver.Tx
	c     *conn
	inbox bool
}

func (t *tx) Commit() error {
	t.c.mu.Lock()
	t.c.tx = nil
	t.c.mu.Unlock()
	if t.inbox && t.c.failCommit() {
		_ = t.Tx.Rollback()
		return errCommitFailed
	}
	return t.Tx.Commit()
}

func (t *tx) Rollback() error {
	t.c.mu.Lock()
	t.c.tx = nil
	t.c.mu.Unlock()
	return t.Tx.Rollback()
}
