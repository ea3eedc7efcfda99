package postgres

import (
	"context"
	"net"
	"sync"
	"time"
)

// socketKey carries a *socket in the context of a Connect, for the dialer
// to record the connection it dials.
type socketKey struct{}

// socket is the network connection of one Connect.
type socket struct {
	mu      sync.Mutex
	nc      net.Conn
	expired bool
}

func (s *socket) set(nc net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nc = nc
	if s.expired {
		_ = nc.SetDeadline(time.Now())
	}
}

func (s *socket) get() net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nc
}

// expire ends every read and write on the socket after d.
func (s *socket) expire(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expired = true
	if s.nc != nil {
		_ = s.nc.SetDeadline(time.Now().Add(d))
	}
}

// dialer is lib/pq's Dialer: net.Dialer's, recording what it dials in the
// Connect's socket.
type dialer struct{ d net.Dialer }

func (d dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

func (d dialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, network, address)
}

func (d dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	nc, err := d.d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if s, ok := ctx.Value(socketKey{}).(*socket); ok {
		s.set(nc)
	}
	return nc, nil
}
