package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// health is what a pool's connections share: how many calls got no
// answer (their socket closed CancelGrace after their context ended).
type health struct{ failures atomic.Uint64 }

// conn is a lib/pq connection whose socket is closed — every read and
// write on it fails — CancelGrace after the context of the call in
// progress ended (lib/pq's cancel request had that long to be answered),
// and CommitTimeout (+ CancelGrace) after a COMMIT or ROLLBACK began. Such a connection is bad: the pool discards it.
//
// database/sql calls a connection from one goroutine at a time; only the
// watches' callbacks run beside the call, and they touch mu's fields and
// the socket's deadline only.
type conn struct {
	inner driver.Conn
	nc    net.Conn
	cfg   Config
	pool  *health
	// seen is the pool's failure count when this connection last answered
	// (or was opened): behind the pool's count, it sat idle across a
	// failure another connection met, and may be stalled the same way.
	seen atomic.Uint64

	mu     sync.Mutex
	fired  int  // watches whose context ended and not yet stopped
	broken bool // a watch fired: the connection is not used again
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
)

// watch arms the socket's deadline for ctx's end: CancelGrace after it,
// or after d when d > 0 (a COMMIT's bound). The returned stop disarms it
// once the call it watched is over, and reports whether it had fired.
func (c *conn) watch(ctx context.Context, d time.Duration) (stop func() bool) {
	var once sync.Once
	fired := false
	fire := func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			fired = true
			c.fired++
			c.broken = true
			_ = c.nc.SetDeadline(time.Now().Add(c.cfg.CancelGrace))
		})
	}
	stopCtx := context.AfterFunc(ctx, fire)
	var timer *time.Timer
	if d > 0 {
		timer = time.AfterFunc(d, fire)
	}
	return func() bool {
		stopped := stopCtx()
		if timer != nil {
			stopped = timer.Stop() && stopped
		}
		if !stopped {
			once.Do(func() {}) // wait for a fire in progress
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if !fired { // the call was answered: the connection is alive
			c.seen.Store(c.pool.failures.Load())
		} else {
			c.fired--
			if c.fired == 0 {
				// The call is over; the connection is discarded all the
				// same (broken), but a Close must not fail on a deadline.
				_ = c.nc.SetDeadline(time.Time{})
			}
		}
		return fired
	}
}

// wrap names a call's failure on a socket this connection closed.
func (c *conn) wrap(ctx context.Context, fired bool, err error) error {
	if err == nil || !fired || !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	c.pool.failures.Add(1) // the pool's idle connections may be stalled too: see ResetSession
	cause := ctx.Err()
	if cause == nil {
		cause = context.DeadlineExceeded
	}
	return fmt.Errorf("postgres: no answer %s after the call's context ended (%w): connection closed: %w", c.cfg.CancelGrace, cause, err)
}

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	st, err := c.inner.Prepare(query)
	if err != nil {
		return nil, err
	}
	return &stmt{inner: st, c: c}, nil
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	stop := c.watch(ctx, 0)
	var st driver.Stmt
	var err error
	if p, ok := c.inner.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = c.inner.Prepare(query)
	}
	if err = c.wrap(ctx, stop(), err); err != nil {
		return nil, err
	}
	return &stmt{inner: st, c: c}, nil
}

func (c *conn) Close() error { return c.inner.Close() }

//nolint:staticcheck // driver.Conn requires Begin; database/sql calls BeginTx.
func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	b, ok := c.inner.(driver.ConnBeginTx)
	if !ok {
		return nil, errors.New("postgres: the driver's connection has no BeginTx")
	}
	stop := c.watch(ctx, 0)
	t, err := b.BeginTx(ctx, opts)
	if err != nil {
		return nil, c.wrap(ctx, stop(), err)
	}
	return &tx{inner: t, c: c, ctx: ctx, stop: stop}, nil
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.inner.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	stop := c.watch(ctx, 0)
	r, err := q.QueryContext(ctx, query, args)
	if err != nil {
		return nil, c.wrap(ctx, stop(), err)
	}
	return &rows{inner: r, c: c, ctx: ctx, stop: stop}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.inner.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	stop := c.watch(ctx, 0)
	r, err := e.ExecContext(ctx, query, args)
	return r, c.wrap(ctx, stop(), err)
}

func (c *conn) Ping(ctx context.Context) error {
	p, ok := c.inner.(driver.Pinger)
	if !ok {
		return nil
	}
	stop := c.watch(ctx, 0)
	err := p.Ping(ctx)
	return c.wrap(ctx, stop(), err)
}

// ResetSession, called as the pool hands out a connection it kept idle,
// refuses (driver.ErrBadConn: the pool closes it and takes another, then
// a new one) a broken connection, and one that sat idle across a call
// another connection of the pool got no answer to: a black hole or a
// partition that stalled one stalled those idle beside it, and after the
// network heals without resetting them, each would cost the call that
// meets it its whole deadline (a delivery's attempt).
func (c *conn) ResetSession(ctx context.Context) error {
	if !c.IsValid() || c.seen.Load() < c.pool.failures.Load() {
		return driver.ErrBadConn
	}
	if r, ok := c.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *conn) IsValid() bool {
	c.mu.Lock()
	broken := c.broken
	c.mu.Unlock()
	if broken {
		return false
	}
	if v, ok := c.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.inner.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// tx is a transaction watched, as lib/pq watches it, until its COMMIT or
// ROLLBACK returns; those are bounded by CommitTimeout as well.
type tx struct {
	inner driver.Tx
	c     *conn
	ctx   context.Context
	stop  func() bool // the BeginTx context's watch
}

func (t *tx) end(f func() error) error {
	t.stop()
	stop := t.c.watch(t.ctx, t.c.cfg.CommitTimeout)
	err := f()
	return t.c.wrap(t.ctx, stop(), err)
}

func (t *tx) Commit() error   { return t.end(t.inner.Commit) }
func (t *tx) Rollback() error { return t.end(t.inner.Rollback) }

// stmt is a prepared statement whose executions are watched.
type stmt struct {
	inner driver.Stmt
	c     *conn
}

var (
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
)

func (s *stmt) Close() error  { return s.inner.Close() }
func (s *stmt) NumInput() int { return s.inner.NumInput() }

//nolint:staticcheck // driver.Stmt requires Exec; database/sql calls ExecContext.
func (s *stmt) Exec(args []driver.Value) (driver.Result, error) { return s.inner.Exec(args) }

//nolint:staticcheck // driver.Stmt requires Query; database/sql calls QueryContext.
func (s *stmt) Query(args []driver.Value) (driver.Rows, error) { return s.inner.Query(args) }

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	e, ok := s.inner.(driver.StmtExecContext)
	if !ok {
		return nil, errors.New("postgres: the driver's statement has no ExecContext")
	}
	stop := s.c.watch(ctx, 0)
	r, err := e.ExecContext(ctx, args)
	return r, s.c.wrap(ctx, stop(), err)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := s.inner.(driver.StmtQueryContext)
	if !ok {
		return nil, errors.New("postgres: the driver's statement has no QueryContext")
	}
	stop := s.c.watch(ctx, 0)
	r, err := q.QueryContext(ctx, args)
	if err != nil {
		return nil, s.c.wrap(ctx, stop(), err)
	}
	return &rows{inner: r, c: s.c, ctx: ctx, stop: stop}, nil
}

// rows are a query's rows, watched until they are closed.
type rows struct {
	inner driver.Rows
	c     *conn
	ctx   context.Context
	once  sync.Once
	stop  func() bool
	fired bool
}

var (
	_ driver.RowsColumnTypeScanType         = (*rows)(nil)
	_ driver.RowsColumnTypeDatabaseTypeName = (*rows)(nil)
	_ driver.RowsColumnTypeLength           = (*rows)(nil)
	_ driver.RowsColumnTypeNullable         = (*rows)(nil)
	_ driver.RowsColumnTypePrecisionScale   = (*rows)(nil)
)

func (r *rows) Columns() []string { return r.inner.Columns() }

func (r *rows) Next(dest []driver.Value) error {
	err := r.inner.Next(dest)
	if err != nil && !errors.Is(err, io.EOF) {
		r.c.mu.Lock()
		fired := r.c.fired > 0
		r.c.mu.Unlock()
		return r.c.wrap(r.ctx, fired, err)
	}
	return err
}

func (r *rows) Close() error {
	err := r.inner.Close()
	r.once.Do(func() { r.fired = r.stop() })
	return r.c.wrap(r.ctx, r.fired, err)
}

func (r *rows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.inner.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

func (r *rows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.inner.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *rows) ColumnTypeLength(i int) (int64, bool) {
	if t, ok := r.inner.(driver.RowsColumnTypeLength); ok {
		return t.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *rows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if t, ok := r.inner.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *rows) ColumnTypePrecisionScale(i int) (precision, scale int64, ok bool) {
	if t, ok := r.inner.(driver.RowsColumnTypePrecisionScale); ok {
		return t.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}
