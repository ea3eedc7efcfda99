package testenv

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// Proxy forwards TCP connections from 127.0.0.1 to an upstream service, and
// can black-hole them: a dependency that accepts connections and never
// answers, as a dead route or a frozen host does; slow its replies
// (Throttle); or, in front of a broker, forward only its heartbeats
// (HeartbeatsOnly), or only what its connection says (ChannelsSilent). It is closed when the test ends.
type Proxy struct {
	ln       net.Listener
	upstream string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	wg       sync.WaitGroup

	mu      sync.Mutex
	holed   bool
	muted   bool          // the upstream's replies are swallowed
	slow    time.Duration // each new connection's first reply is held this long
	hold    chan struct{} // each new connection's first reply is held until it closes (HoldFirstReplies)
	conns   []net.Conn
	links   []*link // the connections forwarded so far
	closing bool
	closed  chan struct{} // closed when the proxy closes: ends a held reply

	frames         bool          // the replies are AMQP frames, tracked (ProxyAMQP)
	heartbeatsOnly bool          // of the replies, only AMQP heartbeat frames are forwarded
	channelsSilent bool          // of the replies, only channel 0's AMQP frames are forwarded
	silentFrom     int           // SilenceChannelsFrom's first connection (0: none)
	silentAfter    int           // and the channels' frames each forwards before
	seq            int           // connections forwarded since the start
	heartbeats     atomic.Int64  // heartbeat frames forwarded since HeartbeatsOnly
	silenced       atomic.Int64  // channel frames swallowed since ChannelsSilent
	channelFrames  atomic.Int64  // channel frames read from the upstream (ChannelFrames)
	accepted       atomic.Int64  // client connections accepted so far (Accepted)
	held           atomic.Int64  // first replies held now (HoldFirstReplies)
	forwarding     atomic.Int64  // connections forwarded whose client has not closed its end (Forwarding)
	limiter        *rate.Limiter // the replies' rate (Throttle), nil when not throttled
	ctx            context.Context
	cancel         context.CancelFunc // ends a throttled write when the proxy closes
}

// link is one forwarded connection; stalled once a black hole caught it
// and healed without resetting it: nothing is forwarded on it again.
type link struct {
	stalled atomic.Bool
	silent  atomic.Bool   // its broker's channels answer nothing (ChannelsAnswerOnNewConnections)
	seq     int           // its place among the connections forwarded (from 1)
	slow    time.Duration // its first reply is held this long (SlowStart)
	hold    chan struct{} // and until this closes (HoldFirstReplies), when not nil
	frames  bool          // its replies are AMQP frames, tracked
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
	p := &Proxy{ln: ln, upstream: upstream, dial: dial, closed: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
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
	p.mu.Lock()
	p.frames = true
	p.mu.Unlock()
	u.Host = p.Addr()
	return p, u.String()
}

// ProxyPostgres starts a Proxy in front of the test database (PostgresURL)
// and returns it with a pool connected through it, closed when t ends.
func ProxyPostgres(t testing.TB) (*Proxy, *sqlx.DB) {
	t.Helper()
	p, dsn := ProxyPostgresURL(t)
	db, err := sqlx.Connect("postgres", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return p, db
}

// ProxyPostgresURL starts a Proxy in front of the test database
// (PostgresURL) and returns it with the URL that connects through it.
func ProxyPostgresURL(t testing.TB) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(PostgresURL)
	require.NoError(t, err)
	p := StartProxy(t, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is how many client connections the proxy accepted so far, black
// holed or not: a test waits for a client to be dialling through it.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

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

// SlowStart holds the first reply of every connection opened from now on
// for d before forwarding it, and everything after it in order: a server
// slow to start a session, as a database on a starved host is (its
// start-up answered seconds late). The connections opened before are not
// slowed.
func (p *Proxy) SlowStart(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slow = d
}

// HoldFirstReplies holds the first reply of every connection opened from
// now on, and everything after it, until release is called: a client
// waits in its handshake (a broker's connection.start) for as long as the
// test needs, e.g. to close what dialed meanwhile. Held says how many
// wait. Release is idempotent; the proxy's end releases them too.
func (p *Proxy) HoldFirstReplies() (release func()) {
	hold := make(chan struct{})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = hold
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.hold == hold {
				p.hold = nil
			}
			close(hold)
		})
	}
}

// Held is how many connections' first replies HoldFirstReplies holds now:
// how many clients wait in their handshake.
func (p *Proxy) Held() int64 { return p.held.Load() }

// Forwarding is how many connections the proxy forwards whose client has
// not closed its end: a client's connections still open.
func (p *Proxy) Forwarding() int64 { return p.forwarding.Load() }

// Heal ends the black hole and DropReplies: every connection opened so far
// is reset (the conversations it swallowed cannot resume), and new ones are
// forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holed = false
	p.muted = false
	p.heartbeatsOnly = false
	p.channelsSilent, p.silentFrom = false, 0
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns, p.links = nil, nil
}

// HealNewConnections ends the black hole and DropReplies for new
// connections only: every connection opened so far stays open and stalled
// (what it sends is swallowed, nothing comes back, ever), as a client's
// socket sees a network partition that heals after the far side lost the
// conversation (a middlebox or proxy that forgot it, a server process that
// is gone behind a live kernel). Unlike Heal, the client's kernel reports
// nothing: only the client's own deadlines end those connections.
func (p *Proxy) HealNewConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holed = false
	p.muted = false
	for _, l := range p.links {
		l.stalled.Store(true)
	}
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
	p.conns, p.links = nil, nil
}

// forwarded records a new forwarded connection.
func (p *Proxy) forwarded() *link {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	l := &link{seq: p.seq}
	p.links = append(p.links, l)
	return l
}

func (p *Proxy) track(c net.Conn) bool {
	p.accepted.Add(1)
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
func (p *Proxy) swallow(l *link, toUpstream bool) bool {
	if l != nil && l.stalled.Load() {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed || (!toUpstream && p.muted)
}

// blackHoled returns whether l is black-holed now: the proxy is, or l stalled.
func (p *Proxy) blackHoled(l *link) bool {
	if l.stalled.Load() {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed
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
	if p.swallow(nil, true) { // black-holed
		_, _ = io.Copy(io.Discard, down) // swallowed, until Heal closes it with the others (HealNewConnections does not)
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
	l := p.forwarded()
	p.mu.Lock()
	l.slow, l.hold, l.frames = p.slow, p.hold, p.frames
	p.mu.Unlock()
	p.forwarding.Add(1)
	defer p.forwarding.Add(-1)
	p.wg.Add(2)
	go p.pipe(l, up, down, false)
	p.pipe(l, down, up, true)
}

// holdReply holds l's first reply for SlowStart's time and until
// HoldFirstReplies releases it; false if the proxy closed meanwhile.
func (p *Proxy) holdReply(l *link) bool {
	if l.slow > 0 {
		select {
		case <-time.After(l.slow):
		case <-p.closed:
			return false
		}
	}
	if l.hold != nil {
		p.held.Add(1)
		defer p.held.Add(-1)
		select {
		case <-l.hold:
		case <-p.closed:
			return false
		}
	}
	return true
}

// pipe copies src to dst, swallowing what arrives while black-holed (or,
// coming back from the upstream, while its replies are dropped); toUpstream
// says which way it copies; nothing once l is stalled.
func (p *Proxy) pipe(l *link, src, dst net.Conn, toUpstream bool) {
	defer p.wg.Done()
	defer func() {
		if !toUpstream && p.blackHoled(l) {
			// The upstream's end is swallowed as its bytes are: the
			// client's socket stays open until Heal, Reset or the
			// proxy's end closes it.
			return
		}
		_ = dst.Close()
	}()
	buf := make([]byte, 32<<10)
	held := !toUpstream && (l.slow > 0 || l.hold != nil)
	var frames *amqpFrames
	if !toUpstream && l.frames {
		frames = &amqpFrames{link: l}
	}
	for {
		n, err := src.Read(buf)
		if n > 0 && held {
			held = false
			if !p.holdReply(l) {
				return
			}
		}
		if n > 0 {
			out := buf[:n]
			if frames != nil {
				out = frames.forward(out, p)
			}
			if !p.swallow(l, toUpstream) {
				if werr := p.write(dst, out, toUpstream); werr != nil {
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
	close(p.closed)
	p.cancel()
	_ = p.ln.Close()
	p.Heal()
	p.wg.Wait()
}
