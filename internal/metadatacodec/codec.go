// Package metadatacodec stores a message's metadata byte for byte in a
// database column (the outbox's rows, the ordering stage's held messages):
// a value that is not valid UTF-8 or holds a NUL included, which JSON or a
// text column would change or refuse.
package metadatacodec

import (
	"encoding/binary"
	"errors"
	"maps"
	"slices"
)

const v1 = 1

// Encode writes a version byte, then each key and value preceded by its
// length (uvarint), keys in order.
func Encode(md map[string]string) []byte {
	b := []byte{v1}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(md[k])))
		b = append(b, md[k]...)
	}
	return b
}

// Decode reads what Encode wrote.
func Decode(b []byte) (map[string]string, error) {
	if len(b) == 0 || b[0] != v1 {
		return nil, errors.New("not metadata of this version")
	}
	b = b[1:]
	md := map[string]string{}
	next := func() (string, error) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return "", errors.New("metadata cut short")
		}
		v := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return v, nil
	}
	for len(b) > 0 {
		k, err := next()
		if err != nil {
			return nil, err
		}
		v, err := next()
		if err != nil {
			return nil, err
		}
		md[k] = v
	}
	return md, nil
}
