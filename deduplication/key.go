package deduplication

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrInvalidKey is matched (errors.Is) by every *KeyError.
var ErrInvalidKey = errors.New("deduplication: invalid key")

// KeyError reports why no deduplication key could be taken from a message:
// the message is poison.
type KeyError struct {
	// Source names where the key was looked for, e.g. `metadata "sluice_event_id"`
	// or `JSON field "eventId"`.
	Source string
	// Reason says what was wrong: "missing", "empty", "not a string or number", ...
	Reason string
	// Err is the underlying error, such as a JSON syntax error, or nil.
	Err error
}

func (e *KeyError) Error() string {
	s := "deduplication key: " + e.Source + ": " + e.Reason
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying error.
func (e *KeyError) Unwrap() error { return e.Err }

// Is reports whether target is ErrInvalidKey.
func (e *KeyError) Is(target error) bool { return target == ErrInvalidKey }

// KeyFunc returns the deduplication key of a message: a business event id,
// stable across redeliveries and republishing. It must not return the
// broker's or Watermill's message id. A message without a usable key gives a
// *KeyError.
type KeyFunc func(msg *message.Message) (string, error)

// sources collects, on the inbox stage's error path, the descriptions of the
// key functions of this package that ran (see deduplicator.keySource).
type (
	sources    []string
	sourcesKey struct{}
)

// noteSource records source when the inbox stage asks which key functions ran.
func noteSource(msg *message.Message, source string) {
	if s, ok := msg.Context().Value(sourcesKey{}).(*sources); ok {
		*s = append(*s, source)
	}
}

// KeyFromMetadata takes the key from the metadata field name.
func KeyFromMetadata(name string) KeyFunc {
	source := fmt.Sprintf("metadata %q", name)
	return func(msg *message.Message) (string, error) {
		noteSource(msg, source)
		v, ok := msg.Metadata[name]
		if !ok {
			return "", &KeyError{Source: source, Reason: "missing"}
		}
		if v == "" {
			return "", &KeyError{Source: source, Reason: "empty"}
		}
		return v, nil
	}
}

// KeyFromJSON takes the key from a field of the JSON object in the payload.
// Several names descend into nested objects: KeyFromJSON("order", "id")
// reads {"order":{"id":"..."}}. A string value is used as is, a number by its
// literal text; null, a missing field, another type, an empty string or a
// payload that is not a JSON object is a *KeyError.
func KeyFromJSON(path ...string) KeyFunc {
	source := fmt.Sprintf("JSON field %q", strings.Join(path, "."))
	return func(msg *message.Message) (string, error) {
		noteSource(msg, source)
		if len(path) == 0 {
			return "", &KeyError{Source: source, Reason: "no field named"}
		}
		raw := json.RawMessage(msg.Payload)
		for i, name := range path {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil {
				what := "payload"
				if i > 0 {
					what = fmt.Sprintf("field %q", strings.Join(path[:i], "."))
				}
				return "", &KeyError{Source: source, Reason: what + " is not a JSON object", Err: err}
			}
			var ok bool
			if raw, ok = obj[name]; !ok || bytes.Equal(raw, []byte("null")) {
				return "", &KeyError{Source: source, Reason: "missing"}
			}
		}
		return jsonScalar(source, raw)
	}
}

func jsonScalar(source string, raw json.RawMessage) (string, error) {
	switch {
	case len(raw) > 0 && raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", &KeyError{Source: source, Reason: "invalid string", Err: err}
		}
		if s == "" {
			return "", &KeyError{Source: source, Reason: "empty"}
		}
		return s, nil
	case len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'):
		return string(raw), nil
	default:
		return "", &KeyError{Source: source, Reason: "not a string or number"}
	}
}

// KeyPrefix returns prefix followed by the key of k:
// KeyPrefix("OrderPlaced:", KeyFromJSON("orderId")) keys by order.
func KeyPrefix(prefix string, k KeyFunc) KeyFunc {
	return func(msg *message.Message) (string, error) {
		key, err := k(msg)
		if err != nil {
			return "", err
		}
		return prefix + key, nil
	}
}

// KeyJoin joins the keys of parts with sep: KeyJoin(":",
// KeyFromMetadata("type"), KeyFromJSON("orderId")). The first part without a
// key gives its error.
func KeyJoin(sep string, parts ...KeyFunc) KeyFunc {
	return func(msg *message.Message) (string, error) {
		keys := make([]string, len(parts))
		for i, k := range parts {
			key, err := k(msg)
			if err != nil {
				return "", err
			}
			keys[i] = key
		}
		return strings.Join(keys, sep), nil
	}
}
