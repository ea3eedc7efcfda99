package rabbitmq

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/diag"
)

// Connection defaults.
const (
	DialTimeoutDefault = 10 * time.Second
	// WriteTimeoutDefault bounds each write to the broker's socket. A broker
	// that stops reading (a connection blocked by a memory or disk alarm)
	// then fails the write instead of holding every publisher.
	WriteTimeoutDefault = 10 * time.Second
)

// DialConfig configures Dial.
type DialConfig struct {
	// Name is the connection_name the broker shows. Default "sluice".
	Name string
	// DialTimeout bounds connecting and the AMQP handshake. Default
	// DialTimeoutDefault.
	DialTimeout time.Duration
	// WriteTimeout bounds each socket write. Default WriteTimeoutDefault.
	WriteTimeout time.Duration
	// TLS configures the TLS of an amqps:// URL (root CAs, client
	// certificate, server name). Default: the system's roots. Refused with
	// an amqp:// URL, which would not use it.
	TLS *tls.Config
}

// Dial connects to url (amqp:// or amqps://). Its errors never hold the
// URL's password, and unwrap to amqp091's (errors.Is(err,
// amqp.ErrCredentials) holds for bad credentials).
func Dial(url string, cfg DialConfig) (*amqp.Connection, error) {
	if err := checkURL(url); err != nil {
		return nil, err
	}
	if cfg.TLS != nil && !strings.HasPrefix(url, "amqps://") {
		return nil, errors.New("rabbitmq: a TLS configuration needs an amqps:// URL")
	}
	dialTimeout := cmp.Or(cfg.DialTimeout, DialTimeoutDefault)
	writeTimeout := cmp.Or(cfg.WriteTimeout, WriteTimeoutDefault)
	dial := amqp.DefaultDial(dialTimeout)
	conn, err := amqp.DialConfig(url, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := dial(network, addr)
			if err != nil {
				return nil, err
			}
			return &deadlineConn{Conn: c, timeout: writeTimeout}, nil
		},
		Properties:      amqp.Table{"connection_name": cmp.Or(cfg.Name, "sluice")},
		TLSClientConfig: cfg.TLS,
	})
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connecting to %s: %w", diag.RedactURL(url), diag.RedactError(err))
	}
	return conn, nil
}

// checkURL reports whether url is an AMQP URI, in an error that never holds
// the password.
func checkURL(url string) error {
	if url == "" {
		return errors.New("rabbitmq: the broker URL is required")
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return fmt.Errorf("rabbitmq: the broker URL %s is not an AMQP URI: %w", diag.RedactURL(url), diag.RedactError(err))
	}
	return nil
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
