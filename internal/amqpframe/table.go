package amqpframe

import (
	"fmt"
	"math"
)

// The limits of upstream amqp091-go v1.17.0's reader (read.go), which
// check replicates: maxFieldDepth and maxContainerElements there.
const (
	// DepthMax is how deeply tables and arrays may nest inside the headers
	// table (readTableDepth and readArrayDepth refuse depth > 32).
	DepthMax = 32
	// ItemsMax is the most items of an array, and the most distinct keys
	// of a table, the client reads (readArrayDepth, readTableDepth:
	// len >= 8192 before adding one more is an error).
	ItemsMax = 8192
)

// readAllocChunk is read.go's readAllocChunk: readBytes reads in chunks
// of this size, which decides between io.EOF and io.ErrUnexpectedEOF for a
// value cut short (and an array ends quietly on io.EOF).
const readAllocChunk = 64 * 1024

// readErr is how one of upstream's reads fails: io.EOF (nothing was left
// to read), io.ErrUnexpectedEOF (part of it), or a syntax error (ErrSyntax,
// a limit) with its reason.
type readErr struct {
	eof    bool
	reason string
}

var (
	errEOF           = &readErr{eof: true, reason: "a value cut short"}
	errUnexpectedEOF = &readErr{reason: "a value cut short"}
	errTooDeep       = &readErr{reason: fmt.Sprintf("tables or arrays nested deeper than %d levels (the client's limit)", DepthMax)}
	errArray         = &readErr{reason: fmt.Sprintf("an array of more than %d items (the client's limit)", ItemsMax)}
	errTable         = &readErr{reason: fmt.Sprintf("a table of more than %d entries (the client's limit)", ItemsMax)}
	errLength        = &readErr{reason: "a length past 2^31-1 bytes"}
)

func errFieldType(typ byte) *readErr {
	return &readErr{reason: fmt.Sprintf("unknown field type %q", typ)}
}

// src is one of the readers upstream's parser reads from: a table's
// contents (a bytes.Buffer there: b from off), or an array's
// io.LimitedReader over its parent (n bytes left).
type src struct {
	b      []byte
	off    int
	parent *src
	n      int
}

func (s *src) avail() int {
	if s.parent == nil {
		return len(s.b) - s.off
	}
	return min(s.n, s.parent.avail())
}

func (s *src) take(k int) {
	for ; s.parent != nil; s = s.parent {
		s.n -= k
	}
	s.off += k
}

// root is the table contents s ultimately reads from.
func (s *src) root() *src {
	for s.parent != nil {
		s = s.parent
	}
	return s
}

// readFull is io.ReadFull of k bytes from s.
func readFull(s *src, k int) *readErr {
	if k == 0 {
		return nil
	}
	a := s.avail()
	switch {
	case a >= k:
		s.take(k)
		return nil
	case a == 0:
		return errEOF
	}
	s.take(a)
	return errUnexpectedEOF
}

// readBytes is read.go's readBytes: n bytes in readAllocChunk chunks.
func readBytes(s *src, n int64) *readErr {
	for got := int64(0); got < n; {
		chunk := min(n-got, readAllocChunk)
		if err := readFull(s, int(chunk)); err != nil {
			return err
		}
		got += chunk
	}
	return nil
}

// readUint reads a k-byte big-endian integer (binary.Read).
func readUint(s *src, k int) (uint64, *readErr) {
	r := s.root()
	start := r.off
	if err := readFull(s, k); err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range r.b[start : start+k] {
		v = v<<8 | uint64(c)
	}
	return v, nil
}

// readShortstr returns the bytes of a short string read from s.
func readShortstr(s *src) ([]byte, *readErr) {
	n, err := readUint(s, 1)
	if err != nil {
		return nil, err
	}
	r := s.root()
	start := r.off
	if err := readBytes(s, int64(n)); err != nil {
		return nil, err
	}
	return r.b[start : start+int(n)], nil
}

// readLongstr returns the bytes of a long string read from s.
func readLongstr(s *src) ([]byte, *readErr) {
	n, err := readUint(s, 4)
	if err != nil {
		return nil, err
	}
	if n > math.MaxInt32 {
		return nil, errLength
	}
	r := s.root()
	start := r.off
	if err := readBytes(s, int64(n)); err != nil {
		return nil, err
	}
	return r.b[start : start+int(n)], nil
}

// checkField is read.go's readFieldDepth, keeping no value.
func checkField(s *src, depth int) *readErr {
	typ, err := readUint(s, 1)
	if err != nil {
		return err
	}
	switch typ {
	case 't', 'B', 'b':
		_, err = readUint(s, 1)
	case 's', 'u':
		_, err = readUint(s, 2)
	case 'I', 'i', 'f':
		_, err = readUint(s, 4)
	case 'l', 'd', 'T':
		_, err = readUint(s, 8)
	case 'D':
		if _, err = readUint(s, 1); err == nil {
			_, err = readUint(s, 4)
		}
	case 'S':
		_, err = readLongstr(s)
	case 'A':
		err = checkArray(s, depth+1)
	case 'F':
		err = checkTable(s, depth+1)
	case 'x':
		var n uint64
		if n, err = readUint(s, 4); err == nil {
			if int32(uint32(n)) < 0 {
				return errLength
			}
			err = readBytes(s, int64(n))
		}
	case 'V':
	default:
		return errFieldType(byte(typ))
	}
	return err
}

// checkTable is read.go's readTableDepth.
func checkTable(s *src, depth int) *readErr {
	if depth > DepthMax {
		return errTooDeep
	}
	contents, err := readLongstr(s)
	if err != nil {
		return err
	}
	t := &src{b: contents}
	keys := newKeySet(len(contents))
	for t.avail() > 0 {
		key, err := readShortstr(t)
		if err != nil {
			return err
		}
		if err := checkField(t, depth); err != nil {
			return err
		}
		if keys.full() {
			return errTable
		}
		keys.add(key)
	}
	return nil
}

// checkArray is read.go's readArrayDepth: an array ends quietly on io.EOF.
func checkArray(s *src, depth int) *readErr {
	if depth > DepthMax {
		return errTooDeep
	}
	size, err := readUint(s, 4)
	if err != nil {
		return err
	}
	if size > math.MaxInt32 {
		return errLength
	}
	lim := &src{parent: s, n: int(size)}
	for items := 0; ; items++ {
		if err := checkField(lim, depth); err != nil {
			if err.eof {
				return nil
			}
			return err
		}
		if items >= ItemsMax {
			return errArray
		}
	}
}

// keySet counts a table's distinct keys as upstream's map does. A table
// whose contents are shorter than 2×(ItemsMax+1) bytes cannot hold more
// than ItemsMax entries (each is at least a key length and a type), so
// only a larger one keeps its keys.
type keySet struct {
	n    int
	seen map[string]struct{}
}

func newKeySet(contents int) keySet {
	if contents < 2*(ItemsMax+1) {
		return keySet{}
	}
	return keySet{seen: make(map[string]struct{})}
}

func (k *keySet) full() bool {
	if k.seen != nil {
		return len(k.seen) >= ItemsMax
	}
	return k.n >= ItemsMax
}

func (k *keySet) add(key []byte) {
	if k.seen != nil {
		k.seen[string(key)] = struct{}{}
		return
	}
	k.n++
}
