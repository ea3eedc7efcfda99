package amqpframe

import (
	"bytes"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// FuzzFrameFilter writes a delivery whose headers table holds the fuzzed
// contents, and a good one behind it, in pieces of a fuzzed size, and
// checks the filter against upstream amqp091-go itself: when the client
// reads the table without the filter, the stream passes byte-identical
// (but for a producer's Key, stripped); when it does not, the client
// reads it through the filter as a delivery whose only header is this
// process's reason. Through the filter the client never fails, the filter
// never panics, and no Key reaches the client but the filter's own.
func FuzzFrameFilter(f *testing.F) {
	for _, h := range hostile {
		if c := contentsOf(h.table, h.name); len(c) < 4096 {
			f.Add(c, uint16(3))
		}
	}
	for _, r := range readable {
		if c := r.table.contents(); len(c) < 4096 {
			f.Add(c, uint16(1))
		}
	}
	f.Add(table{{Key, token + " forged"}, {"a", "b"}}.contents(), uint16(5))
	f.Add(table{{"a", raw{'A', []byte{0, 0, 0, 6, 'F', 0, 0, 0, 1, 9}}}}.contents(), uint16(2))
	f.Fuzz(func(t *testing.T, contents []byte, cut uint16) {
		stream := append(deliver(1, contents, "one"), deliver(2, table{{"k", "v"}}.contents(), "two")...)
		out := filtered(t, stream, int(cut%600)+1)

		plain := open(t, false)
		go func() { _ = plain.send(stream, 0) }()
		want, plainErr := plain.next()

		s := open(t, true)
		go func() { _ = s.send(stream, int(cut%600)+1) }()
		got, err := s.next()
		if err != nil {
			t.Fatalf("through the filter the client failed: %v", err)
		}
		reason, forged := checkHeaders(contents)
		switch {
		case plainErr == nil && len(forged) == 0:
			if !bytes.Equal(out, stream) {
				t.Fatal("a table the client reads was changed")
			}
			if _, ok := got.Headers[Key]; ok {
				t.Fatal("a Key the filter did not write")
			}
		case plainErr == nil:
			if _, ok := got.Headers[Key]; ok {
				t.Fatal("a producer's Key was not stripped")
			}
			delete(want.Headers, Key)
			if len(want.Headers) != len(got.Headers) {
				t.Fatalf("stripping Key changed the other headers: %v, %v", want.Headers, got.Headers)
			}
		default:
			if reason == "" {
				t.Fatalf("the client refused a table the filter passed: %v", plainErr)
			}
			r, ok := Reason(got.Headers)
			if !ok || r != reason || len(got.Headers) != 1 {
				t.Fatalf("headers %v, want only the reason %q", got.Headers, reason)
			}
		}
		if plainErr == nil && reason != "" {
			t.Fatalf("the filter refused a table the client reads: %s", reason)
		}
		next, err := s.next()
		if err != nil || !equalHeaders(next.Headers, amqp.Table{"k": "v"}) || string(next.Body) != "two" {
			t.Fatalf("the delivery behind it: %v, %v", next.Headers, err)
		}
	})
}

func equalHeaders(a, b amqp.Table) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
