package amqp091

import (
	"crypto/tls"
	"io"
	"net"
	"time"

	patched "github.com/sluicemq/sluice/internal/amqp091"
)

// The client's functions. Sluice's rabbitmq.Dial connects with Sluice's
// bounds (DialTimeout, WriteTimeout, several nodes); these are the client's
// own, for a connection of yours.

// Dial accepts a string in the AMQP URI format and returns a new Connection
// over TCP using PlainAuth, as upstream's Dial.
func Dial(url string) (*Connection, error) { return patched.Dial(url) }

// DialTLS is Dial with the tls.Config of an amqps:// URL, as upstream's.
func DialTLS(url string, amqps *tls.Config) (*Connection, error) { return patched.DialTLS(url, amqps) }

// DialTLS_ExternalAuth is DialTLS with the EXTERNAL SASL mechanism
// (RabbitMQ's ssl_cert_login), as upstream's.
func DialTLS_ExternalAuth(url string, amqps *tls.Config) (*Connection, error) { //nolint:revive,staticcheck // upstream's name
	return patched.DialTLS_ExternalAuth(url, amqps)
}

// DialConfig accepts a string in the AMQP URI format and a configuration for
// the transport and connection setup, returning a new Connection, as
// upstream's.
func DialConfig(url string, config Config) (*Connection, error) {
	return patched.DialConfig(url, config)
}

// Open accepts an already established connection, or other io.ReadWriteCloser
// as a transport, and opens an AMQP connection over it, as upstream's.
func Open(conn io.ReadWriteCloser, config Config) (*Connection, error) {
	return patched.Open(conn, config)
}

// DefaultDial is the dial function used when Config.Dial is not set, with
// connectionTimeout bounding the TCP connect, as upstream's.
func DefaultDial(connectionTimeout time.Duration) func(network, addr string) (net.Conn, error) {
	return patched.DefaultDial(connectionTimeout)
}

// NewConnectionProperties creates a Table to be used as Config.Properties,
// with the client's default values.
func NewConnectionProperties() Table { return patched.NewConnectionProperties() }

// ParseURI parses an AMQP URI (amqp:// or amqps://), as upstream's.
func ParseURI(uri string) (URI, error) { return patched.ParseURI(uri) }

// SetLogger sets the client's logger (NullLogger by default). Not safe for
// concurrent use: call it at the start of the program.
func SetLogger(logger Logging) { patched.SetLogger(logger) }
