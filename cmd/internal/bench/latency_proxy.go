package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// latencyProxy forwards TCP connections from 127.0.0.1 to upstream, holding
// every chunk for delay in each direction: a network round trip of 2×delay
// between the benchmark and a broker that runs on loopback. Order is kept.
type latencyProxy struct {
	ln       net.Listener
	upstream string
	delay    time.Duration
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newLatencyProxy(upstream string, delay time.Duration) (*latencyProxy, error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &latencyProxy{ln: ln, upstream: upstream, delay: delay}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *latencyProxy) Addr() string { return p.ln.Addr().String() }

func (p *latencyProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(context.Background(), "tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(down, up)
		go p.pipe(up, down)
	}
}

type chunk struct {
	at   time.Time
	data []byte
}

// pipe copies src to dst, each chunk delay after it was read.
func (p *latencyProxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	q := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			time.Sleep(time.Until(c.at.Add(p.delay)))
			if _, err := dst.Write(c.data); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case q <- chunk{time.Now(), append([]byte(nil), buf[:n]...)}:
			case <-done: // the writer failed: stop reading
				err = io.ErrClosedPipe
			}
		}
		if err != nil {
			close(q)
			<-done
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			} else if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

func (p *latencyProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
