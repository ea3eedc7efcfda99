package bench

import (
	"context"
	"database/sql"
	"net"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// countingDialer dials PostgreSQL and counts the writes on its connections:
// a write is one message batch lib/pq flushes, so writes per message count
// the round trips a variant makes.
type countingDialer struct{ writes *atomic.Int64 }

func (d countingDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

func (d countingDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, network, address)
}

func (d countingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, writes: d.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// openPG opens url with lib/pq; with writes set, every write to the server
// is counted there.
func openPG(ctx context.Context, url string, writes *atomic.Int64) (*sqlx.DB, error) {
	if writes == nil {
		return sqlx.ConnectContext(ctx, "postgres", url)
	}
	connector, err := pq.NewConnector(url)
	if err != nil {
		return nil, err
	}
	connector.Dialer(countingDialer{writes})
	db := sqlx.NewDb(sql.OpenDB(connector), "postgres")
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// writesPerMessage runs op n times in a row and returns the writes it made
// per message.
func writesPerMessage(ctx context.Context, writes *atomic.Int64, n int, op Op) (float64, error) {
	before := writes.Load()
	for i := range n {
		if err := op(ctx, i); err != nil {
			return 0, err
		}
	}
	return float64(writes.Load()-before) / float64(n), nil
}
