package testenv

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections from 127.0.0.1 to an upstream service, and
// can black-hole them: a dependency that accepts connections and never
// answers, as a dead route or a frozen host does. It is closed when the
// test ends.
type Proxy struct {
	ln       net.Listener
	upstream string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	wg       sync.WaitGroup

	mu      sync.Mutex
	holed   bool
	muted   bool // the upstream's replies are swallowed
	conns   []net.Conn
	closing bool
}

// StartProxy listens on a free loopback port and forwards to upstream
// (host:port).
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	return StartProxyDialer(t, upstream, (&net.Dialer{Timeout: 10 * time.Second}).DialContext)
}

// StartProxyDialer is StartProxy connecting to upstream with dial: to a
// node of a Partitionable cluster, PrivateCluster.DialContext.
func StartProxyDialer(t testing.TB, upstream string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *Proxy {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{ln: ln, upstream: upstream, dial: dial}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// ProxyAMQP starts a Proxy in front of the test broker (AMQPURL) and
// returns it with the URL that connects through it.
func ProxyAMQP(t testing.TB) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(AMQPURL)
	require.NoError(t, err)
	p := StartProxy(t, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}

// ProxyPostgres starts a Proxy in front of the test database (PostgresURL)
// and returns it with a pool connected through it, closed when t ends.
func ProxyPostgres(t testing.TB) (*Proxy, *sqlx.DB) {
	t.Helper()
	u, err := url.Parse(PostgresURL)
	require.NoError(t, err)
	p := StartProxy(t, u.Host)
	u.Host = p.Addr()
	db, err := sqlx.Connect("postgres", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return p, db
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// BlackHole stops forwarding: the bytes already sent on open connections
// are swallowed, nothing comes back, and new connections are accepted but
// never reach the upstream.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holed = true
}

// DropReplies keeps forwarding what the client sends and swallows what the
// upstream answers: a broker that stores a publish whose confirm never
// reaches the publisher, as a network fault after the publish does.
func (p *Proxy) DropReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muted = true
}

// Heal ends the black hole and DropReplies: every connection opened so far
// is reset (the conversations it swallowed cannot resume), and new ones are
// forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holed = false
	p.muted = false
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Reset closes every connection opened so far and keeps the proxy's mode:
// after BlackHole, the clients lose their connections and cannot open new
// ones that reach the upstream.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		_ = c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// swallow returns whether bytes copied toward the upstream (toUpstream) or
// back from it are swallowed now.
func (p *Proxy) swallow(toUpstream bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed || (!toUpstream && p.muted)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(down) {
			continue
		}
		p.wg.Add(1)
		go p.serve(down)
	}
}

// serve connects down to the upstream once the proxy is not black-holed,
// then pipes both ways.
func (p *Proxy) serve(down net.Conn) {
	defer p.wg.Done()
	if p.swallow(true) { // black-holed
		_, _ = io.Copy(io.Discard, down) // swallowed, until Heal closes it with the others
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := p.dial(ctx, "tcp", p.upstream)
	cancel()
	if err != nil {
		_ = down.Close()
		return
	}
	if !p.track(up) {
		_ = down.Close()
		return
	}
	p.wg.Add(2)
	go p.pipe(up, down, false)
	p.pipe(down, up, true)
}

// pipe copies src to dst, swallowing what arrives while black-holed (or,
// coming back from the upstream, while its replies are dropped); toUpstream
// says which way it copies.
func (p *Proxy) pipe(src, dst net.Conn, toUpstream bool) {
	defer p.wg.Done()
	defer func() { _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.swallow(toUpstream) {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Heal()
	p.wg.Wait()
}
