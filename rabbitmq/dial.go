package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/amqpframe"
	"github.com/sluicemq/sluice/internal/diag"
)

// Dial connects to conn.URL (amqp:// or amqps://), or to the first of
// conn.URLs that answers, trying them in order, each bounded by
// DialTimeout; it uses conn's URL, TLS, DialTimeout and WriteTimeout. name
// is the connection_name the broker shows ("" is "sluice"). Its errors
// never hold a URL's password, and unwrap to the
// AMQP client's, which package rabbitmq/amqp091 names:
// errors.Is(err, amqp091.ErrCredentials) holds for bad credentials. The
// connection is that package's *Connection.
func Dial(conn Connection, name string) (*amqp.Connection, error) {
	c, err := conn.withDefaults("Connection")
	if err != nil {
		return nil, err
	}
	ac, _, err := c.dial(name, 0)
	return ac, err
}

// dial connects with c, whose defaults are filled, as connection_name
// name: to the first node that answers, trying them in turn from
// URLs[start % len(URLs)], each bounded by DialTimeout. It returns the
// index of the node connected to; its error joins every node's.
func (c Connection) dial(name string, start int) (*amqp.Connection, int, error) {
	return c.dialContext(context.Background(), name, start)
}

// dialContext is dial, given up when ctx ends: the connection being
// opened is closed, its handshake ends at once.
func (c Connection) dialContext(ctx context.Context, name string, start int) (*amqp.Connection, int, error) {
	n := len(c.URLs)
	errs := make([]error, 0, n)
	for k := range n {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		i := (start + k) % n
		conn, err := c.dialNode(ctx, c.URLs[i], name)
		if err == nil {
			return conn, i, nil
		}
		errs = append(errs, err)
	}
	if n == 1 {
		return nil, 0, errs[0]
	}
	return nil, 0, fmt.Errorf("rabbitmq: no node of %d answered: %w", n, errors.Join(errs...))
}

// dialNode connects to the node at url.
func (c Connection) dialNode(ctx context.Context, url, name string) (*amqp.Connection, error) {
	var stop func() bool
	var deadline time.Time // the handshakes', once the socket is open
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	u, cfg, err := amqpframe.Config(url, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			// amqp.DefaultDial's, bounded by ctx as well.
			d := net.Dialer{Timeout: c.DialTimeout}
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			deadline = time.Now().Add(c.DialTimeout)
			if err := nc.SetDeadline(deadline); err != nil { // the TLS and AMQP handshakes
				_ = nc.Close()
				return nil, err
			}
			// ctx ending closes the socket: a handshake the broker does
			// not answer ends at once, not after DialTimeout.
			stop = context.AfterFunc(ctx, func() { _ = nc.Close() })
			return &deadlineConn{Conn: nc, timeout: c.WriteTimeout}, nil // under TLS, the frame filter above it
		},
		Properties:      amqp.Table{"connection_name": cmp.Or(name, "sluice")},
		TLSClientConfig: c.TLS,
	})
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connecting to %s: %w", diag.RedactURL(url), diag.RedactError(err))
	}
	// The frame filter (internal/amqpframe): a delivery whose headers
	// table the client would refuse does not close the connection.
	conn, err := amqp.DialConfig(u, cfg)
	if err != nil {
		// The bound that ended it, so a log line says which setting to look
		// at: the TCP connect's timeout, or the handshakes' deadline (the
		// client reports that one as a frame error, 501).
		if ne := net.Error(nil); ctx.Err() == nil && (errors.As(err, &ne) && ne.Timeout() || !deadline.IsZero() && !time.Now().Before(deadline)) {
			return nil, fmt.Errorf("rabbitmq: connecting to %s: no answer within DialTimeout (%s): %w", diag.RedactURL(url), c.DialTimeout, diag.RedactError(err))
		}
		return nil, fmt.Errorf("rabbitmq: connecting to %s: %w", diag.RedactURL(url), diag.RedactError(err))
	}
	return conn, nil
}

// closeConn closes conn, waiting at most d for the broker's close-ok: a
// broker that does not answer (a node cut off from its cluster's queue
// leader took about 90 s) cannot hold the close past it. The connection is
// closed either way; the error then says the broker did not answer.
// CloseDeadline sets the socket's deadline, which deadlineConn keeps the
// heartbeater from moving forward.
func closeConn(conn *amqp.Connection, d time.Duration) error {
	return conn.CloseDeadline(time.Now().Add(d))
}

// closeWithin runs close, and closes conn at once (every call waiting on it
// returns) if close has not returned within d: for a drain whose channel
// calls wait for the broker's answers.
func closeWithin(conn *amqp.Connection, d time.Duration, close func() error) error {
	t := time.AfterFunc(d, func() { _ = conn.CloseDeadline(time.Now()) })
	defer t.Stop()
	return close()
}

// deadlineConn sets a write deadline before each write, and keeps a
// deadline set with SetDeadline (amqp091-go's Connection.CloseDeadline)
// from being moved later: amqp091-go's heartbeater moves the read deadline
// forward on every frame the server sends, its heartbeats too, so a server
// that sends heartbeats but no close-ok would otherwise hold the close
// (about 90 s, a node cut off from its quorum queue's leader in
// TestClusterPartitionedNode). SetDeadline with the zero time (the end of
// the handshake) lifts it.
type deadlineConn struct {
	net.Conn
	timeout time.Duration

	mu   sync.Mutex
	hard time.Time // SetDeadline's, zero when none
}

// bound returns t, or the hard deadline when it is earlier (or t is none).
func (c *deadlineConn) bound(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hard.IsZero() && (t.IsZero() || t.After(c.hard)) {
		return c.hard
	}
	return t
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.hard = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.bound(t))
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.bound(t))
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	if err := c.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
