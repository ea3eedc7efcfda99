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

// ChannelsSilent keeps forwarding what the client sends and, of what the
// broker replies, only channel 0's frames — the connection's: its
// handshake, heartbeats, blocked and close — and nothing of its channels:
// a broker whose connections open and live and whose channels never
// answer, not even a channel.open. Only a ProxyAMQP's; a frame begun
// before the call is forwarded whole. Heal ends it.
func (p *Proxy) ChannelsSilent() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.channelsSilent = true
}

// ChannelsAnswerOnNewConnections ends ChannelsSilent for the connections
// opened from now on: those open now stay silent, their heartbeats still
// forwarded — only the client's own bound on a channel's answer ends them.
func (p *Proxy) ChannelsAnswerOnNewConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		if p.channelsSilent || p.silentFrom > 0 && l.seq >= p.silentFrom {
			l.silent.Store(true)
		}
	}
	p.channelsSilent, p.silentFrom = false, 0
}

// SilenceChannelsFrom makes the conn-th connection the proxy forwards
// (counted from 1, since its start) and every later one forward their
// first after frames of the broker's channels, then none, as
// ChannelsSilent does: a call past the first ones — a channel's basic.qos
// or basic.consume after its opening — is never answered, and the
// connections before (a check on a connection of its own) answer. Only a
// ProxyAMQP's; ChannelsAnswerOnNewConnections and Heal end it.
func (p *Proxy) SilenceChannelsFrom(conn, after int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silentFrom, p.silentAfter = conn, after
}

// ChannelFrames is how many frames of the broker's channels the proxy
// read, forwarded or swallowed: a test learns from a run how many frames
// its calls take.
func (p *Proxy) ChannelFrames() int { return int(p.channelFrames.Load()) }

// Silenced is how many frames of the broker's channels the proxy swallowed
// while ChannelsSilent: a test waits for a client to be waiting on one.
func (p *Proxy) Silenced() int { return int(p.silenced.Load()) }

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
	hdr          [7]byte
	hn           int  // how much of hdr is read
	left         int  // bytes of the current frame after its header
	keep         bool // the current frame is forwarded
	only, silent bool // the proxy's modes when the current frame began
	silentAfter  int  // the current frame is swallowed if it is a channel's and channelFrames reached it (-1: not)
	link         *link
	// channelFrames counts the frames of the broker's channels seen so far.
	channelFrames int
}

// forward returns the bytes of b to forward: all of them, or those of the
// frames the proxy's modes keep (HeartbeatsOnly: heartbeats;
// ChannelsSilent: channel 0's), as they were when each frame began: a
// frame begun before a mode's call is forwarded whole.
func (s *amqpFrames) forward(b []byte, p *Proxy) []byte {
	const heartbeat = 8
	out := make([]byte, 0, len(b)+len(s.hdr))
	for len(b) > 0 {
		if s.left > 0 { // the frame's payload and frame-end
			k := min(s.left, len(b))
			if s.keep {
				out = append(out, b[:k]...)
			}
			s.left -= k
			b = b[k:]
			continue
		}
		if s.hn == 0 { // a frame's first byte
			p.mu.Lock()
			s.only, s.silent = p.heartbeatsOnly, p.channelsSilent || (s.link != nil && s.link.silent.Load())
			s.silentAfter = -1
			if p.silentFrom > 0 && s.link != nil && s.link.seq >= p.silentFrom {
				s.silentAfter = p.silentAfter
			}
			p.mu.Unlock()
		}
		k := min(len(s.hdr)-s.hn, len(b))
		copy(s.hdr[s.hn:], b[:k])
		s.hn += k
		b = b[k:]
		if s.hn < len(s.hdr) {
			continue
		}
		s.hn, s.left = 0, int(binary.BigEndian.Uint32(s.hdr[3:]))+1
		typ, channel := s.hdr[0], binary.BigEndian.Uint16(s.hdr[1:3])
		silent := s.silent
		if channel != 0 {
			silent = silent || s.silentAfter >= 0 && s.channelFrames >= s.silentAfter
			s.channelFrames++
			p.channelFrames.Add(1)
		}
		s.keep = (!s.only || typ == heartbeat) && (!silent || channel == 0)
		switch {
		case s.keep:
			if s.only {
				p.heartbeats.Add(1)
			}
			out = append(out, s.hdr[:]...)
		case silent && channel != 0:
			p.silenced.Add(1)
		}
	}
	return out
}
