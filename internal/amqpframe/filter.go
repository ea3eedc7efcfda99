package amqpframe

import (
	"encoding/binary"
	"math"
	"net"
	"sync/atomic"
	"time"
)

// HeaderFrameMax is the largest content-header frame the filter holds to
// check, in bytes, header and end octet included: a larger one passes
// unchanged (RabbitMQ's default frame_max, which amqp091-go accepts, is
// 128 KiB).
const HeaderFrameMax = 1 << 20

// AMQP 0-9-1 framing (spec 2.3.5; read.go ReadFrame): type, channel,
// size, payload, frame-end.
const (
	frameHeaderSize = 7
	frameHeader     = 2 // a content-header frame
	frameHeartbeat  = 8
	frameEnd        = 0xCE

	flagContentType     = 0x8000
	flagContentEncoding = 0x4000
	flagHeaders         = 0x2000
)

// Conn is a connection whose reads pass through the filter; writes and
// everything else are the wrapped connection's. It records when it last
// read a byte of a frame other than a heartbeat (Progress).
type Conn struct {
	net.Conn
	f filter

	key   string       // its key in the registry, "" when not in it
	moved atomic.Int64 // when it last read a byte of a frame other than a heartbeat, since epoch
	gone  atomic.Bool  // closed, or its reads failed: out of the registry
}

// NewConn returns c reading through the filter; c itself when it is a
// *Conn already (a filter above another would strip the Key it wrote). It
// is in the registry Progress reads until it is closed or a read fails.
func NewConn(c net.Conn) net.Conn {
	if _, ok := c.(*Conn); ok {
		return c
	}
	fc := &Conn{Conn: c}
	fc.moved.Store(int64(time.Since(epoch)))
	register(fc)
	return fc
}

// Read reads the broker's frames, each content-header frame whose headers
// table the client would refuse rewritten, and records the time when what
// it read holds a byte of a frame other than a heartbeat. A read that
// fails takes c out of the registry: nothing more comes on it.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.f.read(c.Conn, p)
	if c.f.moved {
		c.f.moved = false
		c.moved.Store(int64(time.Since(epoch)))
	}
	if err != nil {
		c.leave()
	}
	return n, err
}

// Close closes the wrapped connection and takes c out of the registry.
func (c *Conn) Close() error {
	c.leave()
	return c.Conn.Close()
}

// reader is what the filter reads from.
type reader interface{ Read(p []byte) (int, error) }

// filter is the state of one connection's incoming frame stream.
type filter struct {
	hdr  [frameHeaderSize]byte // the header of a frame passed through
	hn   int                   // how much of hdr is read
	pass int64                 // bytes of the current frame left to pass through

	collecting bool   // inside a content-header frame
	frame      []byte // the content-header frame so far
	want       int    // its length once its header is read, else 0

	out  []byte // bytes to hand out before anything else
	pend []byte // bytes read and not yet filtered
	buf  []byte // pend's storage
	err  error  // the wrapped reader's error, once pend and out are drained

	typ   byte // the type of the frame being read
	moved bool // a byte of a frame other than a heartbeat was read since the reader cleared it
}

func (f *filter) read(r reader, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if len(f.out) > 0 {
			n := copy(p, f.out)
			f.out = f.out[n:]
			return n, nil
		}
		var n int
		fromPend := len(f.pend) > 0
		switch {
		case fromPend:
			n = copy(p, f.pend)
		case f.err != nil:
			if f.collecting && len(f.frame) > 0 { // cut short: hand out what came
				f.out, f.frame, f.collecting, f.want = f.frame, f.frame[len(f.frame):], false, 0
				continue
			}
			return 0, f.err
		default:
			n, f.err = r.Read(p)
		}
		w, used := f.filter(p[:n])
		if fromPend {
			f.pend = f.pend[used:]
		} else if used < n {
			f.buf = append(f.buf[:0], p[used:n]...)
			f.pend = f.buf
		}
		if w > 0 {
			return w, nil
		}
	}
}

// filter filters b in place: it returns how many bytes at the start of b
// to hand out, and how many of b's bytes it used. It stops after a frame
// it holds is complete (f.out then holds it), leaving the rest of b.
func (f *filter) filter(b []byte) (w, r int) {
	for r < len(b) {
		switch {
		case f.pass > 0:
			f.moved = f.moved || f.typ != frameHeartbeat
			k := int(min(f.pass, int64(len(b)-r)))
			copy(b[w:], b[r:r+k])
			w, r, f.pass = w+k, r+k, f.pass-int64(k)
		case f.collecting:
			f.moved = true
			if f.want == 0 {
				k := min(frameHeaderSize-len(f.frame), len(b)-r)
				f.frame = append(f.frame, b[r:r+k]...)
				r += k
				if len(f.frame) < frameHeaderSize {
					continue
				}
				size := int64(binary.BigEndian.Uint32(f.frame[3:7]))
				if size+frameHeaderSize+1 > HeaderFrameMax { // pass unchanged
					f.out, f.pass, f.collecting = f.frame, size+1, false
					f.frame = f.frame[len(f.frame):]
					return w, r
				}
				f.want = int(size) + frameHeaderSize + 1
			}
			k := min(f.want-len(f.frame), len(b)-r)
			f.frame = append(f.frame, b[r:r+k]...)
			r += k
			if len(f.frame) == f.want {
				f.out = rewrite(f.frame)
				f.frame, f.collecting, f.want = f.frame[:0], false, 0
				return w, r
			}
		case f.hn == 0 && b[r] == frameHeader:
			f.collecting, f.typ = true, frameHeader
			if cap(f.frame) == 0 {
				f.frame = make([]byte, 0, 512)
			}
			f.frame = f.frame[:0]
		default: // another frame's header: passed through as it is read
			if f.hn == 0 {
				f.typ = b[r]
			}
			f.moved = f.moved || f.typ != frameHeartbeat
			k := min(frameHeaderSize-f.hn, len(b)-r)
			copy(f.hdr[f.hn:], b[r:r+k])
			copy(b[w:], b[r:r+k])
			w, r, f.hn = w+k, r+k, f.hn+k
			if f.hn == frameHeaderSize {
				f.pass, f.hn = int64(binary.BigEndian.Uint32(f.hdr[3:7]))+1, 0
			}
		}
	}
	return w, r
}

// rewrite returns the content-header frame fr, or a copy of it whose
// headers table holds only Key and the reason the client would refuse the
// table, or a copy without Key. A frame whose structure is broken before
// the end of its headers table is returned as it is: the client fails on
// it whatever the filter does (and RabbitMQ sends none).
func rewrite(fr []byte) []byte {
	payload := fr[frameHeaderSize : len(fr)-1]
	if fr[len(fr)-1] != frameEnd || len(payload) < 14 {
		return fr
	}
	flags := binary.BigEndian.Uint16(payload[12:14])
	if flags&flagHeaders == 0 {
		return fr
	}
	off := 14
	for _, flag := range []uint16{flagContentType, flagContentEncoding} {
		if flags&flag != 0 {
			if off >= len(payload) {
				return fr
			}
			off += 1 + int(payload[off])
		}
	}
	if off+4 > len(payload) {
		return fr
	}
	n := int64(binary.BigEndian.Uint32(payload[off:]))
	if n > math.MaxInt32 || int64(off)+4+n > int64(len(payload)) {
		return fr
	}
	start, end := off+4, off+4+int(n)
	reason, forged := checkHeaders(payload[start:end])
	switch {
	case reason != "":
		// The replacement (at most 4+1+len(Key)+1+4+len(token)+1+reasonMax
		// = 268 bytes) makes a frame longer only when the table it replaces
		// is shorter than that: the frame is then under 3 KB (the other
		// properties are 12 short strings and a few octets at most), below
		// the smallest frame_max a client negotiates (4,096), so the client
		// never refuses the rewritten frame for its size.
		return frame(fr, payload[:off], replacement(reason), payload[end:])
	case len(forged) > 0:
		table := make([]byte, 4, 4+n)
		last := start
		for _, e := range forged {
			table = append(table, payload[last:start+e[0]]...)
			last = start + e[1]
		}
		table = append(table, payload[last:end]...)
		binary.BigEndian.PutUint32(table, uint32(len(table)-4))
		return frame(fr, payload[:off], table, payload[end:])
	}
	return fr
}

// frame returns the frame of fr's type and channel with the payload
// before, table, after.
func frame(fr, before, table, after []byte) []byte {
	size := len(before) + len(table) + len(after)
	b := make([]byte, 0, frameHeaderSize+size+1)
	b = append(b, fr[:3]...)
	b = appendUint32(b, uint32(size))
	b = append(b, before...)
	b = append(b, table...)
	b = append(b, after...)
	return append(b, frameEnd)
}
