package amqpframe

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// connectionTimeoutDefault is amqp091-go's defaultConnectionTimeout.
const connectionTimeoutDefault = 30 * time.Second

// Config returns the URL and the Config with which amqp091-go's
// DialConfig connects to the same broker as with uri and cfg, reading
// through the filter: cfg.Dial (amqp.DefaultDial when nil) dials, and the
// filter wraps what it returns. amqp091-go wraps what Dial returns in TLS
// itself when the scheme is amqps, which would put the filter under TLS,
// reading encrypted bytes: for amqps the returned Dial does the TLS
// handshake (cfg.TLSClientConfig, or the one the URI's cacertfile,
// certfile, keyfile and server_name_indication describe, as amqp091-go
// builds it) and puts the filter above it, and the URL returned is amqp://
// to the same host and port.
func Config(uri string, cfg amqp.Config) (string, amqp.Config, error) {
	u, err := amqp.ParseURI(uri)
	if err != nil {
		return "", cfg, err
	}
	dial := cfg.Dial
	if dial == nil {
		timeout := connectionTimeoutDefault
		if u.ConnectionTimeout > 0 {
			timeout = time.Duration(u.ConnectionTimeout) * time.Millisecond
		}
		dial = amqp.DefaultDial(timeout)
	}
	if u.Scheme != "amqps" {
		cfg.Dial = func(network, addr string) (net.Conn, error) {
			c, err := dial(network, addr)
			if err != nil {
				return nil, err
			}
			return NewConn(c), nil
		}
		return uri, cfg, nil
	}
	tc := cfg.TLSClientConfig
	if tc == nil {
		if tc, err = tlsConfig(u); err != nil {
			return "", cfg, err
		}
	} else {
		tc = tc.Clone()
	}
	if tc.ServerName == "" {
		tc.ServerName = u.Host
	}
	plain, err := url.Parse(uri)
	if err != nil {
		return "", cfg, err
	}
	plain.Scheme = "amqp"
	plain.Host = net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
	cfg.TLSClientConfig = nil
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		c, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		t := tls.Client(c, tc)
		if err := t.Handshake(); err != nil {
			_ = c.Close()
			return nil, err
		}
		return NewConn(t), nil
	}
	return plain.String(), cfg, nil
}

// tlsConfig is the TLS configuration the URI u describes.
func tlsConfig(u amqp.URI) (*tls.Config, error) {
	c := &tls.Config{ServerName: u.ServerName, MinVersion: tls.VersionTLS12}
	if u.CACertFile != "" {
		pem, err := os.ReadFile(u.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("amqpframe: reading the CA certificate: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("amqpframe: no certificate in " + u.CACertFile)
		}
	}
	if u.CertFile != "" && u.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(u.CertFile, u.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("amqpframe: loading the client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
