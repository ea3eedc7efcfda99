package rabbitmq

import (
	"cmp"
	"fmt"
	"net"
	"time"

	amqp "github.com/sluicemq/sluice/internal/amqp091"
	"github.com/sluicemq/sluice/internal/diag"
)

// DialConfig configures Dial.
type DialConfig struct {
	// Connection is the broker's URL and the connection's options; Dial
	// uses its URL, TLS, DialTimeout and WriteTimeout.
	Connection
	// Name is the connection_name the broker shows. Default "sluice".
	Name string
}

// Dial connects to cfg.URL (amqp:// or amqps://). Its errors never hold the
// URL's password, and unwrap to amqp091's (errors.Is(err,
// amqp.ErrCredentials) holds for bad credentials).
func Dial(cfg DialConfig) (*amqp.Connection, error) {
	c, err := cfg.withDefaults("DialConfig")
	if err != nil {
		return nil, err
	}
	return c.dial(cfg.Name)
}

// dial connects with c, whose defaults are filled, as connection_name name.
func (c Connection) dial(name string) (*amqp.Connection, error) {
	dial := amqp.DefaultDial(c.DialTimeout)
	conn, err := amqp.DialConfig(c.URL, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			nc, err := dial(network, addr)
			if err != nil {
				return nil, err
			}
			return &deadlineConn{Conn: nc, timeout: c.WriteTimeout}, nil
		},
		Properties:      amqp.Table{"connection_name": cmp.Or(name, "sluice")},
		TLSClientConfig: c.TLS,
	})
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connecting to %s: %w", diag.RedactURL(c.URL), diag.RedactError(err))
	}
	return conn, nil
}

// deadlineConn sets a write deadline before each write.
type deadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	if err := c.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
