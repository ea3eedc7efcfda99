package testenv

import (
	"encoding/binary"
	"net"

	"golang.org/x/time/rate"
)

// Throttle forwards the upstream's replies, on every connection (open or
// new) together, at most bytesPerSecond — a slow link, or a loaded host —
// in steady writes (a twentieth of a second's worth at most, 32 KiB), so
// the client reads the replies as they come; 0 lifts it. The client's
// bytes are not slowed.
func (p *Proxy) Throttle(bytesPerSecond int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if bytesPerSecond <= 0 {
		p.limiter = nil
		return
	}
	p.limiter = rate.NewLimiter(rate.Limit(bytesPerSecond), min(max(bytesPerSecond/20, 1), 32<<10))
}

// HeartbeatsOnly keeps forwarding what the client sends and, of what the
// broker replies, only its heartbeat frames: a broker whose connection is
// alive and whose channels answer nothing, as when a channel waits on a
// queue whose leader is cut off — the client's heartbeat never gives such
// a connection up. Only a ProxyAMQP's; a frame begun before the call is
// forwarded whole. Heal ends it.
func (p *Proxy) HeartbeatsOnly() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.heartbeatsOnly = true
}

// Heartbeats is how many heartbeat frames the proxy forwarded to its
// clients while HeartbeatsOnly.
func (p *Proxy) Heartbeats() int { return int(p.heartbeats.Load()) }

// write writes b to dst, at the Throttle's rate when toward the client.
func (p *Proxy) write(dst net.Conn, b []byte, toUpstream bool) error {
	p.mu.Lock()
	lim := p.limiter
	p.mu.Unlock()
	if toUpstream || lim == nil {
		_, err := dst.Write(b)
		return err
	}
	for len(b) > 0 {
		k := min(len(b), lim.Burst())
		if err := lim.WaitN(p.ctx, k); err != nil {
			return err
		}
		if _, err := dst.Write(b[:k]); err != nil {
			return err
		}
		b = b[k:]
	}
	return nil
}

// amqpFrames follows the frames of a broker's replies (AMQP 0-9-1: type,
// channel, size, payload, frame-end), to forward only some of them.
type amqpFrames struct {
	hdr  [7]byte
	hn   int  // how much of hdr is read
	left int  // bytes of the current frame after its header
	keep bool // the current frame is forwarded
}

// forward returns the bytes of b to forward, in b's storage: all of them,
// or while p is HeartbeatsOnly those of the heartbeat frames begun since
// (whole frames: the choice is made at a frame's first byte).
func (s *amqpFrames) forward(b []byte, p *Proxy) []byte {
	const heartbeat = 8
	out := b[:0]
	for len(b) > 0 {
		k := min(s.left, len(b))
		if s.left == 0 { // a frame's header
			if s.hn == 0 {
				p.mu.Lock()
				only := p.heartbeatsOnly
				p.mu.Unlock()
				s.keep = !only || b[0] == heartbeat
				if only && s.keep {
					p.heartbeats.Add(1)
				}
			}
			k = min(len(s.hdr)-s.hn, len(b))
			copy(s.hdr[s.hn:], b[:k])
			if s.hn += k; s.hn == len(s.hdr) {
				s.left, s.hn = int(binary.BigEndian.Uint32(s.hdr[3:]))+1, 0
			}
		} else {
			s.left -= k
		}
		if s.keep {
			out = append(out, b[:k]...)
		}
		b = b[k:]
	}
	return out
}
