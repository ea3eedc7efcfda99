package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/sluicemq/sluice/internal/diag"
)

// Defaults of Config.
const (
	// connectTimeoutDefault bounds a connection's TCP connect and its
	// start-up (TLS, authentication) when the DSN sets no connect_timeout.
	connectTimeoutDefault = 5 * time.Second
	// cancelGraceDefault is how long a statement may go on after its
	// context ended — time for the server to answer lib/pq's cancel
	// request — before its connection is closed.
	cancelGraceDefault = time.Second
	// commitTimeoutDefault bounds a COMMIT or ROLLBACK, which take no
	// context of their own.
	commitTimeoutDefault = time.Minute
	// tcpUserTimeoutDefault is how long data sent on a connection may stay
	// unacknowledged before the kernel ends it (Linux; TCP_USER_TIMEOUT).
	tcpUserTimeoutDefault = 30 * time.Second
)

// keepAlive probes an idle connection after 15 s and ends it after 3
// unanswered probes 5 s apart: a vanished peer is seen within 30 s.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// Config configures Open.
type Config struct {
	// DSN is lib/pq's: a postgres:// URL or key=value pairs (the PG*
	// environment variables fill what it leaves out). Required. Its
	// connect_timeout, when set, wins over ConnectTimeout.
	DSN string
	// ConnectTimeout bounds each connection's TCP connect and start-up.
	// Default 5 s.
	ConnectTimeout time.Duration
	// CancelGrace is how long a statement may go on after its context
	// ended before its connection is closed (the statement then fails, and
	// the pool opens another connection). Default 1 s.
	CancelGrace time.Duration
	// CommitTimeout bounds a COMMIT or ROLLBACK (the end of the context
	// their transaction began on bounds them too, plus CancelGrace).
	// Default 1 min.
	CommitTimeout time.Duration
	// TCPUserTimeout is how long sent data may stay unacknowledged before
	// the kernel ends the connection (Linux only). Default
	// 30 s.
	TCPUserTimeout time.Duration
}

func (c Config) withDefaults() Config {
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, connectTimeoutDefault)
	c.CancelGrace = cmp.Or(c.CancelGrace, cancelGraceDefault)
	c.CommitTimeout = cmp.Or(c.CommitTimeout, commitTimeoutDefault)
	c.TCPUserTimeout = cmp.Or(c.TCPUserTimeout, tcpUserTimeoutDefault)
	return c
}

func (c Config) validate() error {
	if c.DSN == "" {
		return errors.New("postgres: Config.DSN is required")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ConnectTimeout", c.ConnectTimeout}, {"CancelGrace", c.CancelGrace}, {"CommitTimeout", c.CommitTimeout}, {"TCPUserTimeout", c.TCPUserTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("postgres: Config.%s must not be negative, got %s", d.name, d.v)
		}
	}
	return nil
}

// Open validates cfg and returns a pool on the database (driver name
// "postgres"), without connecting: the first use does (db.PingContext to
// check at start). The pool keeps up to 64 idle connections, each closed
// once it has been idle 5 minutes: database/sql keeps 2, so with more
// deliveries in flight each transaction past the second would open a
// connection and close it — a PostgreSQL server process started for each.
// Set its other limits yourself (SetMaxOpenConns, which lowers the idle
// cap with it, SetConnMaxLifetime); SetMaxIdleConns and SetConnMaxIdleTime
// change these. Errors never carry the DSN's password.
func Open(cfg Config) (*sqlx.DB, error) {
	c, err := NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(idleConns)
	db.SetConnMaxIdleTime(idleTime)
	return sqlx.NewDb(db, "postgres"), nil
}

// Open's idle connections: at most idleConns, each closed after idleTime
// unused.
const (
	idleConns = 64
	idleTime  = 5 * time.Minute
)

// NewConnector is Open's connector, for sql.OpenDB.
func NewConnector(cfg Config) (driver.Connector, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pcfg, err := pq.NewConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres: Config.DSN: %w", diag.RedactError(err))
	}
	if pcfg.ConnectTimeout <= 0 {
		pcfg.ConnectTimeout = cfg.ConnectTimeout
	}
	inner, err := pq.NewConnectorConfig(pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: Config.DSN: %w", diag.RedactError(err))
	}
	inner.Dialer(dialer{d: net.Dialer{Timeout: pcfg.ConnectTimeout, KeepAliveConfig: keepAlive, Control: userTimeout(cfg.TCPUserTimeout)}})
	return &connector{inner: inner, cfg: cfg, pool: &health{}}, nil
}

// connector opens lib/pq's connections on sockets it keeps a hand on.
type connector struct {
	inner *pq.Connector
	cfg   Config
	pool  *health
}

// Connect opens a connection within ctx as well as ConnectTimeout.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	s := &socket{}
	ctx = context.WithValue(ctx, socketKey{}, s)
	// lib/pq's start-up does not watch ctx: its end closes the socket.
	stop := context.AfterFunc(ctx, func() { s.expire(0) })
	dc, err := c.inner.Connect(ctx)
	if !stop() && err == nil { // ctx ended: the connection may be cut
		_ = dc.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	nc := s.get()
	if nc == nil { // not dialed by us (a Unix socket path is)
		return dc, nil
	}
	cn := &conn{inner: dc, nc: nc, cfg: c.cfg, pool: c.pool}
	cn.seen.Store(c.pool.failures.Load())
	return cn, nil
}

// Driver returns lib/pq's driver, marked as Open's (Driver).
func (c *connector) Driver() driver.Driver { return Driver{c.inner.Driver()} }

// Driver is the driver of Open's pools (db.Driver()): lib/pq's, marked so
// that a pool Open returned can be told from one sql.Open("postgres", dsn)
// returned, whose waits are not bounded (service.New warns of such a pool).
type Driver struct{ driver.Driver }

// BoundsEveryWait marks the driver of a pool whose every wait is bounded.
func (Driver) BoundsEveryWait() {}
