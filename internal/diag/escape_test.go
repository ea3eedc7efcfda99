package diag_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/diag"
)

// hostile holds every kind of character a terminal acts on: OSC (window
// title), CSI (clear screen), a C1 CSI, bidi overrides and isolates, a
// forged line, DEL, invalid UTF-8.
const hostile = "a\x1b]0;OWNED\x07\x1b[2J b\u009b31m c\u202eevil\u202c d\u2066e\u2069 f\r\nsluice: forged\x7f \xff"

// rawControl returns the first character of s a terminal would act on
// (Control, but newline and tab when lines is set), or -1.
func rawControl(s string, lines bool) rune {
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		if lines && (r == '\n' || r == '\t') {
			continue
		}
		if diag.Control(r) {
			return r
		}
	}
	return -1
}

func TestEscape(t *testing.T) {
	t.Parallel()
	require.Equal(t, `a\x1b]0;OWNED\x07\x1b[2J b\x9b31m c\u202eevil\u202c d\u2066e\u2069 f\r\nsluice: forged\x7f `+"\uFFFD", diag.Escape(hostile))
	require.Equal(t, "plain text: é ✓ 日本", diag.Escape("plain text: é ✓ 日本"))
	require.Equal(t, -1, int(rawControl(diag.Printable(hostile, 1000), false)))
	require.Equal(t, `a\x1b]0…`, diag.Printable(hostile, 10))
}

// JSON output escapes what encoding/json leaves raw (C1, bidi, DEL) and
// decodes to the same values.
func TestEscapeJSON(t *testing.T) {
	t.Parallel()
	v := map[string]any{"k\u202e": hostile, "n": 1, "list": []string{"\u009b", "ok"}}
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	require.NotEqual(t, -1, int(rawControl(string(raw), false)), "encoding/json alone leaves C1 and bidi raw")
	esc := diag.EscapeJSON(raw)
	require.Equal(t, -1, int(rawControl(string(esc), false)), "%s", esc)
	require.Contains(t, string(esc), `\u009b31m`)
	require.Contains(t, string(esc), `\u202eevil`)
	var back, want map[string]any
	require.NoError(t, json.Unmarshal(esc, &back))
	require.NoError(t, json.Unmarshal(raw, &want))
	require.Equal(t, want, back, "the same values")
	plain := []byte(`{"a":"b"}`)
	require.Equal(t, plain, diag.EscapeJSON(plain))
}

// Through Watermill's own StdLoggerAdapter, fields passed through LogFields
// and errors through RedactError: no raw control character in the log, one
// line per entry, whatever the fields and the error hold; the error still
// unwraps to its cause.
func TestLogFieldsAndRedactErrorEscape(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := watermill.NewStdLoggerWithOut(&buf, true, false)
	cause := errors.New("handler: " + hostile)
	err := diag.RedactError(cause)
	l.Error("isolated", err, diag.LogFields(watermill.LogFields{"event_id": hostile, "reason": hostile, "attempt": 3, "err2": cause}))
	l.With(diag.LogFields(watermill.LogFields{"key" + hostile: hostile})).Info("duplicate", diag.LogFields(watermill.LogFields{"s": stringer(hostile)}))
	l.Debug("d", nil)
	out := buf.String()
	require.Equal(t, 3, strings.Count(out, "\n"), "one line each, none forged: %q", out)
	require.Equal(t, -1, int(rawControl(out, true)), "%q", out)
	require.Contains(t, out, `\x1b]0;OWNED`)
	require.ErrorIs(t, err, cause, "the escaped error unwraps to the cause")
	require.Contains(t, out, "attempt=3")
	fields := watermill.LogFields{"a": "plain", "n": 1, "e": cause}
	require.Equal(t, fields["n"], diag.LogFields(fields)["n"], "a number stays a number")
	plain := watermill.LogFields{"a": "plain", "n": 1}
	require.Equal(t, plain, diag.LogFields(plain))
}

// fieldErrors is an error of an uncomparable type, as
// validator.ValidationErrors: a slice.
type fieldErrors []string

func (f fieldErrors) Error() string { return "invalid: " + strings.Join(f, ", ") }

// An error field of an uncomparable type passes through LogFields: kept as
// it is when its text is plain, escaped when it is not. Before, LogFields
// compared it with ==, which panics on such a value: the line's caller, a
// stage handling a delivery, panicked.
func TestLogFieldsTakesAnErrorOfAnUncomparableType(t *testing.T) {
	t.Parallel()
	plain := fieldErrors{"quantity"}
	out := diag.LogFields(watermill.LogFields{"err": plain})
	require.Equal(t, plain, out["err"])
	out = diag.LogFields(watermill.LogFields{"err": fieldErrors{hostile}})
	require.Equal(t, -1, int(rawControl(out["err"].(error).Error(), true)), "escaped")
	require.ErrorAs(t, out["err"].(error), new(fieldErrors), "it unwraps to the original")
}

type stringer string

func (s stringer) String() string { return string(s) }

// A Terminal keeps newlines and tabs, escapes the rest, and holds back a
// character split across writes.
func TestTerminal(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	term := diag.NewTerminal(&buf)
	in := []byte("ok\tcell\n" + hostile + "\n\u009b\u202e end\n")
	for i := range in { // one byte at a time: every character split
		n, err := term.Write(in[i : i+1])
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	require.NoError(t, term.Flush())
	out := buf.String()
	require.Equal(t, -1, int(rawControl(out, true)), "%q", out)
	require.True(t, strings.HasPrefix(out, "ok\tcell\na\\x1b]0;OWNED"), "%q", out)
	require.True(t, strings.HasSuffix(out, `\x9b\u202e end`+"\n"), "%q", out)
	require.Equal(t, &buf, term.Unwrap())
}
