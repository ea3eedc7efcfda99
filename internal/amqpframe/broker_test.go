package amqpframe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A fake broker on one end of a net.Pipe: just enough AMQP 0-9-1 for
// upstream amqp091-go's client to open a connection, a channel and a
// consumer, and then read the frames a test writes.

// frameBytes is an AMQP frame of type typ on channel ch.
func frameBytes(typ byte, ch uint16, payload []byte) []byte {
	b := []byte{typ, byte(ch >> 8), byte(ch)}
	b = appendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	return append(b, frameEnd)
}

func method(ch, class, id uint16, args []byte) []byte {
	p := binary.BigEndian.AppendUint16(nil, class)
	p = binary.BigEndian.AppendUint16(p, id)
	return frameBytes(1, ch, append(p, args...))
}

func shortstr(s string) []byte { return append([]byte{byte(len(s))}, s...) }

func longstr(b []byte) []byte { return append(appendUint32(nil, uint32(len(b))), b...) }

// deliver is basic.deliver, content header (its headers table's contents
// given raw, with a message id), and body frames of a delivery on channel 1.
func deliver(tag uint64, table []byte, body string) []byte {
	args := shortstr("c")
	args = binary.BigEndian.AppendUint64(args, tag)
	args = append(args, 0)
	args = append(args, shortstr("")...)
	args = append(args, shortstr("q")...)
	b := method(1, 60, 60, args)
	h := binary.BigEndian.AppendUint16(nil, 60)
	h = binary.BigEndian.AppendUint16(h, 0)
	h = binary.BigEndian.AppendUint64(h, uint64(len(body)))
	h = binary.BigEndian.AppendUint16(h, flagContentType|flagHeaders|0x0080) // content type, headers, message id
	h = append(h, shortstr("text/plain")...)
	h = append(h, longstr(table)...)
	h = append(h, shortstr("m"+string(rune('0'+tag%10)))...)
	b = append(b, frameBytes(frameHeader, 1, h)...)
	if body != "" {
		b = append(b, frameBytes(3, 1, []byte(body))...)
	}
	return b
}

// readFrame reads one frame the client sent.
func readFrame(r io.Reader) ([]byte, error) {
	var h [7]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	p := make([]byte, binary.BigEndian.Uint32(h[3:])+1)
	_, err := io.ReadFull(r, p)
	return p, err
}

// session is a client connected to the fake broker, consuming.
type session struct {
	conn       *amqp.Connection
	deliveries <-chan amqp.Delivery
	closed     chan *amqp.Error
	server     net.Conn
}

// open connects upstream's client to a fake broker, through the filter
// when filtered, and consumes on channel 1.
func open(t testing.TB, filtered bool) *session {
	t.Helper()
	server, client := net.Pipe()
	var c net.Conn = client
	if filtered {
		c = NewConn(client)
	}
	handshake := make(chan error, 1)
	go func() {
		handshake <- func() error {
			var proto [8]byte
			if _, err := io.ReadFull(server, proto[:]); err != nil {
				return err
			}
			start := []byte{0, 9}
			start = append(start, longstr(nil)...)
			start = append(start, longstr([]byte("PLAIN"))...)
			start = append(start, longstr([]byte("en_US"))...)
			steps := []struct {
				reads int
				reply []byte
			}{
				{0, method(0, 10, 10, start)},
				{1, method(0, 10, 30, []byte{0, 0, 0, 2, 0, 0, 0, 0})}, // start-ok; tune: frame_max 128 KiB, no heartbeat
				{2, method(0, 10, 41, shortstr(""))},                   // tune-ok, open
				{1, method(1, 20, 11, longstr(nil))},                   // channel.open
				{1, method(1, 60, 21, shortstr("c"))},                  // basic.consume
			}
			for _, s := range steps {
				for range s.reads {
					if _, err := readFrame(server); err != nil {
						return err
					}
				}
				if _, err := server.Write(s.reply); err != nil {
					return err
				}
			}
			return nil
		}()
		for { // acks, close: read and dropped
			if _, err := readFrame(server); err != nil {
				return
			}
		}
	}()
	conn, err := amqp.Open(c, amqp.Config{SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "guest", Password: "guest"}}, Vhost: "/"})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{conn: conn, closed: conn.NotifyClose(make(chan *amqp.Error, 1)), server: server}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if s.deliveries, err = ch.Consume("q", "c", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-handshake; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return s
}

// send writes stream in pieces of at most cut bytes (all at once when 0).
func (s *session) send(stream []byte, cut int) error {
	if cut <= 0 {
		cut = len(stream)
	}
	for len(stream) > 0 {
		k := min(cut, len(stream))
		if _, err := s.server.Write(stream[:k]); err != nil {
			return err
		}
		stream = stream[k:]
	}
	return nil
}

var errConnectionClosed = errors.New("connection closed")

// nextBound bounds a wait for the next delivery: a hang's bound, not a
// measurement — a table of 10,000 headers read a byte at a time under the
// race detector takes seconds on an idle machine and took over a minute at
// load average 40.
const nextBound = 3 * time.Minute

// next returns the next delivery, or the error the connection closed with.
func (s *session) next() (amqp.Delivery, error) {
	select {
	case d, ok := <-s.deliveries:
		if ok {
			return d, nil
		}
	case <-time.After(nextBound):
		return amqp.Delivery{}, fmt.Errorf("no delivery in %v", nextBound)
	}
	select {
	case e := <-s.closed:
		if e != nil {
			return amqp.Delivery{}, e
		}
	case <-time.After(nextBound):
	}
	return amqp.Delivery{}, errConnectionClosed
}
