package amqpframe

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/metakeys"
)

// Key is the only header of a table the filter replaced: its value is
// token, a space, and the reason the client could not read the table,
// e.g. `header "tags": an array of more than 8192 items (the client's
// limit)`. The filter strips it from every other incoming headers table.
const Key = metakeys.HeadersError

// reasonMax bounds the reason the filter writes, in bytes: a rewritten
// frame is never more than 268 bytes longer than the original, and only
// when the original is under 3 KB (rewrite).
const reasonMax = 200

// token marks what this process's filter wrote: 16 random bytes, in hex.
var token = func() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}()

// Reason returns the reason the filter wrote in headers, when it replaced
// the delivery's headers table: ok is false when headers hold no Key, or
// one this process's filter did not write (a producer's forgery, or a
// delivery read without the filter).
func Reason(headers amqp.Table) (reason string, ok bool) {
	v, _ := headers[Key].(string)
	r, found := strings.CutPrefix(v, token+" ")
	if !found || r == "" {
		return "", false
	}
	return r, true
}

// checkHeaders is read.go's readTableDepth at depth 0 on a headers
// table's contents. It returns why the client would refuse the table
// (empty when it reads it) and where the table holds Key — the offsets of
// each such entry in contents, to strip.
func checkHeaders(contents []byte) (reason string, forged [][2]int) {
	reason, forged = checkEntries(contents)
	if len(reason) > reasonMax {
		reason = strings.ToValidUTF8(reason[:reasonMax], "")
	}
	return reason, forged
}

func checkEntries(contents []byte) (reason string, forged [][2]int) {
	t := &src{b: contents}
	keys := newKeySet(len(contents))
	n := 0
	var limit bool // more than ItemsMax distinct keys: count the rest
	for t.avail() > 0 {
		start := t.off
		key, err := readShortstr(t)
		if err != nil {
			return fmt.Sprintf("after %d headers: %s", n, err.reason), nil
		}
		if err := checkField(t, 0); err != nil {
			return fmt.Sprintf("header %q: %s", bound(key), err.reason), nil
		}
		n++
		if limit {
			continue
		}
		if keys.full() {
			limit = true
			continue
		}
		keys.add(key)
		if string(key) == Key {
			forged = append(forged, [2]int{start, t.off})
		}
	}
	if limit {
		return fmt.Sprintf("%d headers, more than %d (the client's limit)", n, ItemsMax), nil
	}
	return "", forged
}

// bound keeps a header name in a reason short and printable.
func bound(key []byte) string {
	const max = 64
	if len(key) > max {
		return strings.ToValidUTF8(string(key[:max]), "?") + "..."
	}
	return strings.ToValidUTF8(string(key), "?")
}

// replacement is the headers table holding only Key with reason (at
// most reasonMax bytes: checkHeaders bounds it), at most 268 bytes.
func replacement(reason string) []byte {
	v := token + " " + reason
	b := make([]byte, 0, 4+1+len(Key)+1+4+len(v))
	entry := 1 + len(Key) + 1 + 4 + len(v)
	b = appendUint32(b, uint32(entry))
	b = append(b, byte(len(Key)))
	b = append(b, Key...)
	b = append(b, 'S')
	b = appendUint32(b, uint32(len(v)))
	return append(b, v...)
}

func appendUint32(b []byte, v uint32) []byte {
	return append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}
