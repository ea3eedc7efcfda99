package diag

import (
	"fmt"
	"maps"

	"github.com/ThreeDotsLabs/watermill"
)

// LogFields returns a log line's fields made safe for message contents:
// their keys, string values and the texts of their error and fmt.Stringer
// values escaped (Escape), so that an event id, a reason, a key or a
// handler's error quoting a payload can never put an escape sequence, a
// bidirectional override or a forged line into the log. Values that need no
// escape are kept as they are (non-string values keep their type; an
// escaped error unwraps to the original), and so is the map when none does.
// Every stage passes the fields of a line about a delivery through it; the
// error of such a line goes through RedactError, which escapes too.
func LogFields(fields watermill.LogFields) watermill.LogFields {
	var out watermill.LogFields
	for k, v := range fields {
		ek, ev, changed := Escape(k), v, false
		switch x := v.(type) {
		case string:
			if e := Escape(x); e != x {
				ev, changed = e, true
			}
		case error:
			if e, ok := escapedError(x); ok { // not e != x: == panics on an error of an uncomparable type
				ev, changed = e, true
			}
		case fmt.Stringer:
			if t := x.String(); needsEscape(t, false) {
				ev, changed = Escape(t), true
			}
		}
		if !changed && ek == k {
			continue
		}
		if out == nil {
			out = maps.Clone(fields)
		}
		if ek != k {
			delete(out, k)
		}
		out[ek] = ev
	}
	if out == nil {
		return fields
	}
	return out
}

// escapedError is err when its text needs no escape, else an error with the
// escaped text that unwraps to err, and true.
func escapedError(err error) (error, bool) {
	if err == nil {
		return nil, false
	}
	t := err.Error()
	if !needsEscape(t, false) {
		return err, false
	}
	return &Error{text: Escape(t), err: err}, true
}
