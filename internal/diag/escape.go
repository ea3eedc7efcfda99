package diag

import (
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Control reports whether r is a character that must never reach a terminal
// or a log line raw: C0 controls (ESC, BEL, CR, LF, TAB included), DEL, the
// C1 controls (U+0080–U+009F: U+009B is a CSI on many terminals), the line
// and paragraph separators, and the Unicode bidirectional controls (U+061C,
// U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), which reorder what is
// shown.
func Control(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r == 0x2028, r == 0x2029,
		r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Escape returns s with invalid UTF-8 replaced by U+FFFD and every Control
// character written as a Go escape — \n, \r, \t, \x1b, \x9b, \u202e — so
// that a message's contents can never move the cursor, set a window title,
// clear the screen, reorder a line or start a forged one. Text without such
// characters comes back as it is. (A backslash is not escaped: the result
// is for reading, not for decoding.)
func Escape(s string) string {
	if !needsEscape(s, false) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		if !Control(r) {
			b.WriteRune(r)
			continue
		}
		switch r {
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			var hex [8]byte
			if r < 0x100 {
				b.WriteString(`\x`)
				b.Write(appendHex(hex[:0], r, 2))
			} else {
				b.WriteString(`\u`)
				b.Write(appendHex(hex[:0], r, 4))
			}
		}
	}
	return b.String()
}

// appendHex appends r in lower-case hex, padded with zeros to digits.
func appendHex(dst []byte, r rune, digits int) []byte {
	for w := rune(1) << (4 * (digits - 1)); w > 1 && r < w; w >>= 4 {
		dst = append(dst, '0')
	}
	return strconv.AppendUint(dst, uint64(r), 16)
}

// needsEscape reports whether s holds invalid UTF-8 or a Control character
// (but newline and tab when lines is set).
func needsEscape(s string, lines bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 || c == 0x7f) && (!lines || c != '\n' && c != '\t') {
				return true
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || Control(r) {
			return true
		}
		i += n
	}
	return false
}

// EscapeJSON returns JSON text, as encoding/json writes it, with the Control
// characters encoding/json leaves raw — DEL, the C1 controls and the
// bidirectional controls (it escapes those below U+0020 and U+2028/U+2029
// itself) — written as \uXXXX escapes. The JSON decodes to the same values;
// printed, it holds no character a terminal acts on. encoding/json's output
// is valid UTF-8 and has these characters only inside strings (keys
// included), where \uXXXX means the same character.
func EscapeJSON(b []byte) []byte {
	var out []byte
	last := 0
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			if b[i] == 0x7f {
				out = append(append(out, b[last:i]...), `\u007f`...)
				last = i + 1
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if Control(r) {
			out = append(out, b[last:i]...)
			out = appendHex(append(out, `\u`...), r, 4)
			last = i + n
		}
		i += n
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

// Terminal is an io.Writer for what a command prints: it escapes (Escape)
// every Control character but newline and tab on its way to the writer
// beneath, so that no text a command prints — an error naming a queue, a
// table of reasons — can drive the terminal, whatever forgot to escape it.
// A multi-byte character split across writes is held back until it is
// whole; Flush writes what is held. Not safe for concurrent use.
type Terminal struct {
	w       io.Writer
	pending []byte
}

// NewTerminal returns a Terminal writing to w.
func NewTerminal(w io.Writer) *Terminal { return &Terminal{w: w} }

// Write escapes p and writes it; it returns len(p) when the writer beneath
// took everything.
func (t *Terminal) Write(p []byte) (int, error) {
	b := p
	if len(t.pending) > 0 {
		b = append(t.pending, p...) //nolint:gocritic // pending's bytes, then p's, into a buffer pending no longer owns
		t.pending = nil
	}
	cut := len(b)
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				cut = i
			}
			break
		}
	}
	if cut < len(b) {
		t.pending = append([]byte(nil), b[cut:]...)
	}
	if _, err := io.WriteString(t.w, terminalText(string(b[:cut]))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a character held back incomplete (as U+FFFD).
func (t *Terminal) Flush() error {
	if len(t.pending) == 0 {
		return nil
	}
	p := t.pending
	t.pending = nil
	_, err := io.WriteString(t.w, terminalText(string(p)))
	return err
}

// Unwrap returns the writer beneath (a progress bar that draws with escape
// sequences of its own writes there).
func (t *Terminal) Unwrap() io.Writer { return t.w }

// terminalText is Escape keeping newlines and tabs.
func terminalText(s string) string {
	if !needsEscape(s, true) {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		fields := strings.Split(l, "\t")
		for j, f := range fields {
			fields[j] = Escape(f)
		}
		lines[i] = strings.Join(fields, "\t")
	}
	return strings.Join(lines, "\n")
}
