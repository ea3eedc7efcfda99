package amqpframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// hostile are headers tables upstream amqp091-go v1.17.0 refuses to
// read (closing the connection with FRAME_ERROR), each with the reason the
// filter writes.
var hostile = []struct {
	name   string
	table  table
	reason string
}{
	{"array of 8193 items", table{{"arr", items(8193)}}, `header "arr": an array of more than 8192 items (the client's limit)`},
	{"array of 9000 items", table{{"ok", "x"}, {"arr", items(9000)}}, `header "arr": an array of more than 8192 items (the client's limit)`},
	{"8193 headers", many(8193, 0), "8193 headers, more than 8192 (the client's limit)"},
	{"10000 headers", many(10000, 0), "10000 headers, more than 8192 (the client's limit)"},
	{"8192 headers and a repeated one", many(8193, 1)[:8193:8193], ""}, // filled in below
	{"tables nested 33 deep", table{{"deep", nestTables(33)}}, `header "deep": tables or arrays nested deeper than 32 levels (the client's limit)`},
	{"arrays nested 33 deep", table{{"deep", nestArrays(33)}}, `header "deep": tables or arrays nested deeper than 32 levels (the client's limit)`},
	{"a nested table of 8193 entries", table{{"n", many(8193, 0)}}, `header "n": a table of more than 8192 entries (the client's limit)`},
	{"a nested array past the limit", table{{"n", table{{"a", items(8193)}}}}, `header "n": an array of more than 8192 items (the client's limit)`},
	{"unknown field type", table{{"u", raw{'U', []byte{0, 1}}}}, `header "u": unknown field type 'U'`},
	{"a field type the client does not read (L)", table{{"ok", int32(1)}, {"l", raw{'L', make([]byte, 8)}}}, `header "l": unknown field type 'L'`},
	{"a value cut short", table{{"s", raw{'S', []byte{0, 0, 0, 9, 'x'}}}}, `header "s": a value cut short`},
	{"a negative byte array", table{{"x", raw{'x', []byte{0xff, 0xff, 0xff, 0xff}}}}, `header "x": a length past 2^31-1 bytes`},
	{"a key cut short", table{{"k", "v"}, {"", raw{}}}, ""}, // replaced below
}

// readable are headers tables the client reads, at and around its limits.
var readable = []struct {
	name  string
	table table
}{
	{"strings and numbers", table{{"a", "b"}, {"n", int32(7)}, {"v", nil}}},
	{"an array of 8192 items", table{{"arr", items(8192)}}},
	{"8192 headers", many(8192, 0)},
	{"8194 entries of 8191 keys", many(8194, 3)}, // upstream counts a table's keys, not its entries
	{"tables nested 32 deep", table{{"deep", nestTables(32)}}},
	{"arrays nested 32 deep", table{{"deep", nestArrays(32)}}},
	{"an array ending in a cut-short value", table{{"a", raw{'A', []byte{0, 0, 0, 3, 'V', 'D', 5}}}, {"b", "c"}}}, // io.EOF ends an array quietly
	{"empty", table{}},
}

func init() {
	// 8192 distinct keys then one more entry, even a repeated key: upstream
	// refuses it (len(table) >= 8192 before adding).
	t := many(8192, 0)
	hostile[4].table = append(t, kv{"h0", int32(0)})
	hostile[4].reason = "8193 headers, more than 8192 (the client's limit)"
	hostile[len(hostile)-1].table = nil
	hostile[len(hostile)-1].reason = `after 0 headers: a value cut short`
}

func contentsOf(t table, name string) []byte {
	if name == "a key cut short" {
		return []byte{5, 'a'} // a key of 5 bytes, 1 there
	}
	return t.contents()
}

// Upstream's client fails the connection on each hostile table; through
// the filter it reads the delivery with one header, Key, whose reason
// Reason gives, and the next delivery as sent — whatever the reads' sizes.
func TestTheFilterTurnsEveryHostileTableIntoAReason(t *testing.T) {
	t.Parallel()
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			stream := append(deliver(1, contentsOf(h.table, h.name), "bad"), deliver(2, table{{"k", "v"}}.contents(), "good")...)

			s := open(t, false)
			go func() { _ = s.send(stream, 0) }()
			_, err := s.next()
			var ae *amqp.Error
			require.True(t, errors.As(err, &ae), "upstream alone fails: %v", err)
			require.Equal(t, amqp.FrameError, ae.Code)

			for _, cut := range cuts(len(stream)) {
				s := open(t, true)
				go func() { _ = s.send(stream, cut) }()
				d, err := s.next()
				require.NoError(t, err, "cut %d", cut)
				require.Len(t, d.Headers, 1)
				reason, ok := Reason(d.Headers)
				require.True(t, ok)
				require.Equal(t, h.reason, reason)
				require.Equal(t, "bad", string(d.Body))
				require.Equal(t, "m1", d.MessageId, "the properties after the table kept")
				d, err = s.next()
				require.NoError(t, err)
				require.Equal(t, amqp.Table{"k": "v"}, d.Headers)
				require.Equal(t, "good", string(d.Body))
			}
		})
	}
}

// cuts are the read sizes a test tries: every size up to 64 bytes, and a
// few larger ones (net.Pipe hands each write to the reader as it is). A
// stream past 16 KiB (the tables of thousands of headers) is tried in
// pieces of 1 to 3 bytes, not 64 sizes: its single bytes already end a read
// at every boundary, and its 64 cuts were 4.7 times the writes of cut 1
// alone — four such tables side by side under the race detector outlived
// the next delivery's minute at load average 40 on 2 cores.
func cuts(n int) []int {
	c := []int{0, 4096, 4097, 65536}
	smallest := 64
	if n > 16<<10 {
		smallest = 3
	}
	for k := 1; k <= min(n, smallest); k++ {
		c = append(c, k)
	}
	if testing.Short() {
		return c[:min(len(c), 8)]
	}
	return c
}

// Tables the client reads pass through the filter byte-identical, at
// every cut, and the client reads the same headers with it and without.
func TestTheFilterPassesReadableTablesByteIdentical(t *testing.T) {
	t.Parallel()
	for _, r := range readable {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			stream := append(deliver(1, r.table.contents(), "one"), deliver(2, nil, "")...)
			for cut := 1; cut <= 300; cut++ {
				require.True(t, bytes.Equal(stream, filtered(t, stream, cut)), "cut %d", cut)
			}
			plain := open(t, false)
			go func() { _ = plain.send(stream, 0) }()
			want, err := plain.next()
			require.NoError(t, err)
			s := open(t, true)
			go func() { _ = s.send(stream, 7) }()
			got, err := s.next()
			require.NoError(t, err)
			require.Equal(t, want.Headers, got.Headers)
			_, ok := Reason(got.Headers)
			require.False(t, ok)
		})
	}
}

// filtered is what the filter hands out of stream written in pieces of
// cut bytes and read with buffers of cut+3 bytes.
func filtered(t testing.TB, stream []byte, cut int) []byte {
	var out bytes.Buffer
	f := &filter{}
	r := &chunks{b: stream, cut: cut}
	p := make([]byte, cut+3)
	for {
		n, err := f.read(r, p)
		out.Write(p[:n])
		if err == io.EOF {
			return out.Bytes()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// chunks reads b at most cut bytes at a time.
type chunks struct {
	b   []byte
	cut int
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.cut)], c.b)
	c.b = c.b[n:]
	return n, nil
}

// A producer's Key is stripped from the table, the rest kept, so it
// cannot pose as the filter's reason; Reason refuses a Key without this
// process's token.
func TestAProducersKeyIsStripped(t *testing.T) {
	t.Parallel()
	forged := table{{"a", "b"}, {Key, token + " forged"}, {"c", int32(1)}, {Key, "x"}}
	stream := deliver(1, forged.contents(), "body")
	s := open(t, true)
	go func() { _ = s.send(stream, 3) }()
	d, err := s.next()
	require.NoError(t, err)
	require.Equal(t, amqp.Table{"a": "b", "c": int32(1)}, d.Headers)
	_, ok := Reason(amqp.Table{Key: "0123 forged"})
	require.False(t, ok)
}

// Frames other than content headers, and content headers past
// HeaderFrameMax, pass unchanged.
func TestOtherFramesPassUnchanged(t *testing.T) {
	t.Parallel()
	big := frameBytes(frameHeader, 1, make([]byte, HeaderFrameMax))
	stream := append(frameBytes(8, 0, nil), big...)
	stream = append(stream, frameBytes(3, 1, []byte("body"))...)
	stream = append(stream, []byte("AMQP\x00\x00\x09\x01")...)
	for _, cut := range []int{1, 2, 7, 8, 4096, len(stream)} {
		require.True(t, bytes.Equal(stream, filtered(t, stream, cut)), "cut %d", cut)
	}
}

// A rewritten frame is longer than the original only when the table it
// replaces is shorter than the replacement; even with every other property
// at its longest, that frame stays within the smallest frame_max a client
// negotiates (4,096 bytes), so the client never refuses it for its size.
func TestARewrittenFrameFitsTheSmallestFrameMax(t *testing.T) {
	t.Parallel()
	long := shortstr(string(bytes.Repeat([]byte{'p'}, 255)))
	// A short table whose reason names its key at the length a reason keeps.
	bad := table{{string(bytes.Repeat([]byte{'k'}, 64)), raw{'U', nil}}}.contents()
	h := binary.BigEndian.AppendUint16(nil, 60)
	h = binary.BigEndian.AppendUint16(h, 0)
	h = binary.BigEndian.AppendUint64(h, 1)
	h = binary.BigEndian.AppendUint16(h, 0xfffc) // every property
	h = append(h, long...)                       // content type
	h = append(h, long...)                       // content encoding
	h = append(h, longstr(bad)...)               // headers
	h = append(h, 2, 9)                          // delivery mode, priority
	for range 4 {                                // correlation id, reply to, expiration, message id
		h = append(h, long...)
	}
	h = binary.BigEndian.AppendUint64(h, 0) // timestamp
	for range 4 {                           // type, user id, app id, cluster id
		h = append(h, long...)
	}
	fr := frameBytes(frameHeader, 1, h)
	out := rewrite(fr)
	off := frameHeaderSize + 14 + 2*len(long) // the headers table
	n := int(binary.BigEndian.Uint32(out[off:]))
	entry := out[off+4 : off+4+n]
	k := int(entry[0])
	require.Equal(t, Key, string(entry[1:1+k]))
	require.Equal(t, byte('S'), entry[1+k])
	reason, ok := Reason(amqp.Table{Key: string(entry[1+k+1+4:])})
	require.True(t, ok)
	require.Contains(t, reason, "unknown field type 'U'")
	require.Greater(t, len(out), len(fr), "the table replaced is shorter than its replacement")
	require.LessOrEqual(t, len(out), 4096)
}
