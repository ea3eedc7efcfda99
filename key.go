package sluice

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/keysource"
)

// KeyError reports why no key could be taken from a message — the inbox's
// deduplication key (package deduplication), the ordering stage's entity
// (package ordering): the message is poison. Match it with errors.As.
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

// KeyFunc returns a key of a message. The inbox's (deduplication.Config.Key,
// service.Handler.Key) is its deduplication key: a business event id, stable
// across redeliveries and republishing, never the broker's or Watermill's
// message id. The ordering stage's (ordering.Config.Key,
// service.Handler.OrderBy) is the entity whose events apply in order. A
// message without a usable key gives a *KeyError.
type KeyFunc func(msg *message.Message) (string, error)

// KeyFromMetadata takes the key from the metadata field name.
func KeyFromMetadata(name string) KeyFunc {
	source := fmt.Sprintf("metadata %q", name)
	return func(msg *message.Message) (string, error) {
		keysource.Note(msg.Context(), source) // for the inbox's error path (internal/keysource)
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

// KeyFromJSON takes the key from a string field of the JSON object in the
// payload. Several names descend into nested objects: KeyFromJSON("order",
// "id") reads {"order":{"id":"..."}}. The key is exactly the string the
// producer wrote: invalid UTF-8 or an escaped lone surrogate (\ud800), which
// a JSON decoder silently turns into U+FFFD — so that two different ids
// would become one key and the second event be acked as a duplicate — is a
// *KeyError, as are null, a missing field, an empty string, a payload that
// is not a JSON object, and any other type.
//
// A name matches the members encoding/json would decode into a struct
// field tagged with it: regardless of case, by its folding rules
// (strings.EqualFold, Unicode simple folds included: "eventId", "EventID",
// "EVENTID"). Exactly one such member gives the key, whatever its case — the
// value a handler decoding the payload into struct{EventID string
// `json:"eventId"`} sees; two or more (`{"eventId":"A","EVENTID":"B"}`, where
// encoding/json takes the last and other decoders the first or the exact
// spelling) are a *KeyError: the inbox could not key the event the handler
// applies.
//
// A number is a *KeyError too: it has many spellings of one value (1000,
// 1e3, 1000.0) and many producers round it past 2^53, so it is no identity;
// and a number 1234567 must never share a key with the string "1234567".
// For integer ids use KeyFromJSONInteger.
func KeyFromJSON(path ...string) KeyFunc {
	return keyFromJSON(path, "not a string (a number id: use KeyFromJSONInteger)", jsonString)
}

// KeyFromJSONInteger takes the key from an integer field of the JSON object
// in the payload, as KeyFromJSON does from a string field: the key is the
// integer's decimal text. Only the one canonical spelling is taken (an
// optional minus and digits without leading zeros, so 42, not 042, 42.0 or
// 4.2e1) and a string is refused, so one id never has two keys.
func KeyFromJSONInteger(path ...string) KeyFunc {
	return keyFromJSON(path, "not an integer", jsonInteger)
}

func keyFromJSON(path []string, wrongType string, scalar func(raw json.RawMessage) (string, string)) KeyFunc {
	source := fmt.Sprintf("JSON field %q", strings.Join(path, "."))
	return func(msg *message.Message) (string, error) {
		keysource.Note(msg.Context(), source) // for the inbox's error path (internal/keysource)
		if len(path) == 0 {
			return "", &KeyError{Source: source, Reason: "no field named"}
		}
		raw := json.RawMessage(msg.Payload)
		for i, name := range path {
			if err := jsonObject(raw); err != nil {
				what := "payload"
				if i > 0 {
					what = fmt.Sprintf("field %q", strings.Join(path[:i], "."))
				}
				return "", &KeyError{Source: source, Reason: what + " is not a JSON object", Err: err}
			}
			v, names := jsonMembers(raw, name)
			if len(names) > 1 {
				return "", &KeyError{Source: source, Reason: fmt.Sprintf("field %q appears %d times, counting the names encoding/json matches to it regardless of case (%s): decoders disagree on which one counts",
					strings.Join(path[:i+1], "."), len(names), quotedNames(names))}
			}
			if raw = v; len(names) == 0 || bytes.Equal(raw, []byte("null")) {
				return "", &KeyError{Source: source, Reason: "missing"}
			}
		}
		key, reason := scalar(raw)
		switch {
		case reason == "wrong type":
			return "", &KeyError{Source: source, Reason: wrongType}
		case reason != "":
			return "", &KeyError{Source: source, Reason: reason}
		case key == "":
			return "", &KeyError{Source: source, Reason: "empty"}
		}
		return key, nil
	}
}

// jsonObject returns encoding/json's error for raw when it would not decode
// raw into a map — not valid JSON, or valid and neither an object nor null
// — without decoding it when it would: jsonMembers reads its members.
func jsonObject(raw json.RawMessage) error {
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) > 0 && t[0] == '{' && json.Valid(raw) {
		return nil
	}
	return json.Unmarshal(raw, new(map[string]json.RawMessage))
}

// jsonMembers returns the names of the members of the JSON object raw (valid)
// that encoding/json matches to a struct field named name — equal under
// its case folding, strings.EqualFold, after unescaping ("event\u0049d" is
// "eventId") — and the value of the last of them, the one it keeps.
func jsonMembers(raw json.RawMessage, name string) (json.RawMessage, []string) {
	var names []string
	var v json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		return nil, nil
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return v, names
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return v, names
		}
		if k, _ := tok.(string); strings.EqualFold(k, name) {
			names = append(names, k)
			v = value
		}
	}
	return v, names
}

// quotedNames lists names for a reason: quoted, escaped, at most 3.
func quotedNames(names []string) string {
	q := make([]string, 0, 3)
	for _, n := range names[:min(len(names), 3)] {
		q = append(q, strconv.Quote(diag.Bound(n, 64)))
	}
	if len(names) > 3 {
		q = append(q, "…")
	}
	return strings.Join(q, ", ")
}

// jsonInteger returns the text of a canonical JSON integer, or a reason.
func jsonInteger(raw json.RawMessage) (string, string) {
	s := string(raw)
	digits := strings.TrimPrefix(s, "-")
	switch {
	case len(s) == 0 || (s[0] != '-' && (s[0] < '0' || s[0] > '9')):
		return "", "wrong type"
	case digits == "" || strings.Trim(digits, "0123456789") != "":
		return "", "not an integer (a fraction or an exponent)"
	case len(digits) > 1 && digits[0] == '0', s == "-0":
		return "", "not a canonical integer (a leading zero or -0)"
	}
	return s, ""
}

// jsonString decodes a JSON string exactly, or returns a reason: the raw
// bytes must be valid UTF-8 and every \u escape a character or a whole
// surrogate pair, where encoding/json would substitute U+FFFD.
func jsonString(raw json.RawMessage) (string, string) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", "wrong type"
	}
	in := raw[1 : len(raw)-1]
	if !utf8.Valid(in) {
		return "", "not valid UTF-8 (the producer's bytes would be changed)"
	}
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); i++ {
		c := in[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++ // json.Unmarshal of the object has checked the escapes' syntax
		switch in[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(in[i+1 : i+5])
			i += 4
			if utf16.IsSurrogate(r) {
				if r >= 0xDC00 || i+6 >= len(in) || in[i+1] != '\\' || in[i+2] != 'u' {
					return "", "an unpaired UTF-16 surrogate escape (the producer's character would be changed)"
				}
				lo := hex4(in[i+3 : i+7])
				if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
					return "", "an unpaired UTF-16 surrogate escape (the producer's character would be changed)"
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\', '/'
			out = append(out, in[i])
		}
	}
	return string(out), ""
}

// hex4 decodes four hex digits that json.Unmarshal has validated.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
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
