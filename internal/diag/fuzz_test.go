package diag_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicemq/sluice/internal/diag"
)

var leftPassword = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s"']*:([^@\s"']*)@`)

// FuzzSummary: a summary is bounded, valid UTF-8 without NUL bytes, and
// leaves no URL password but the mask.
func FuzzSummary(f *testing.F) {
	f.Add("dial amqp://guest:guest@127.0.0.1:5672/: refused", 1024)
	f.Add("postgres://u:p@h/db password=secret \xff\x00", 40)
	f.Add(strings.Repeat("é", 600), 7)
	f.Add("a://b:c@d://e:f@g", 3)
	f.Fuzz(func(t *testing.T, text string, max int) {
		max = int(uint(max) % 4097)
		s := diag.Summary(errors.New(text), max)
		if len(s) > max {
			t.Fatalf("summary of %d bytes, max %d", len(s), max)
		}
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			t.Fatalf("summary not clean UTF-8: %q", s)
		}
		for _, m := range leftPassword.FindAllStringSubmatch(diag.Redact(text), -1) {
			if m[1] != diag.Mask {
				t.Fatalf("password %q left in %q", m[1], diag.Redact(text))
			}
		}
	})
}
