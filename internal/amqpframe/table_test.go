package amqpframe

import (
	"encoding/binary"
	"fmt"
)

// A small encoder of AMQP field tables for the tests, able to write what
// the client refuses: kv pairs in order, values of the types below.

type kv struct {
	k string
	v any
}

type table []kv

// raw is a field written as it is: its type octet and its bytes.
type raw struct {
	typ byte
	b   []byte
}

type array []any

func (t table) contents() []byte {
	var b []byte
	for _, e := range t {
		b = append(b, shortstr(e.k)...)
		b = appendField(b, e.v)
	}
	return b
}

func appendField(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, 'V')
	case string:
		return append(append(b, 'S'), longstr([]byte(v))...)
	case int32:
		return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v))
	case table:
		return append(append(b, 'F'), longstr(v.contents())...)
	case array:
		var items []byte
		for _, x := range v {
			items = appendField(items, x)
		}
		return append(append(b, 'A'), longstr(items)...)
	case raw:
		return append(append(b, v.typ), v.b...)
	}
	panic(fmt.Sprintf("no encoding for %T", v))
}

// many is a table of n entries h0..h(n-1), int32 values, the keys
// distinct unless dup says how many repeat the first key.
func many(n, dup int) table {
	t := make(table, 0, n)
	for i := range n {
		k := fmt.Sprintf("h%d", i)
		if i >= n-dup {
			k = "h0"
		}
		t = append(t, kv{k, int32(i)})
	}
	return t
}

func nestTables(levels int) any {
	var v any = "leaf"
	for range levels {
		v = table{{"n", v}}
	}
	return v
}

func nestArrays(levels int) any {
	var v any = "leaf"
	for range levels {
		v = array{v}
	}
	return v
}

func items(n int) array { return make(array, n) }
