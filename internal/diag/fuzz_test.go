package diag_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicemq/sluice/internal/diag"
)

// leftPassword finds a URL's password: after the user's colon, up to an @.
var leftPassword = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#\s"']*:([^@\s]*)@`)

// FuzzSummary: a summary is bounded, valid UTF-8 without NUL bytes, and
// leaves no URL password but the mask.
func FuzzSummary(f *testing.F) {
	f.Add("dial amqp://guest:guest@127.0.0.1:5672/: refused", 1024)
	f.Add("postgres://u:p@h/db password=secret \xff\x00", 40)
	f.Add(strings.Repeat("é", 600), 7)
	f.Add("a://b:c@d://e:f@g", 3)
	f.Add("host=db password='hunter 2' dbname=x", 200)
	f.Add("PGPASSWORD=hunter2 Authorization: Bearer tok.en", 200)
	f.Add("dial amqp://u:s3'cret8@h/ GITHUB_TOKEN=ghp_x", 200)
	f.Add(`{"refresh_token":"1//0g"} amqp://a:b/c@d@e/f`, 64)
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

// FuzzRedactSecret: a secret placed in any of the forms Redact knows never
// survives, whatever text stands around it.
func FuzzRedactSecret(f *testing.F) {
	f.Add("connect failed: ", "Hunter2Secret", " (retrying)", uint8(0))
	f.Add("", "s3cr3t", "", uint8(3))
	f.Add("x\n", "tok.EN-123_/+=", "}", uint8(5))
	f.Add("POST /token", "ya29.a0AfH6SM", "&x=1", uint8(8))
	f.Add("env", "wJalrXUtnFEMI/K7MDENG", "", uint8(10))
	f.Add("got", "1//0gLm-xyz", `,"ok":false}`, uint8(13))
	forms := []string{
		"amqp://user:%s@host:5672/",
		"password=%s",
		"password='%s'",
		"PGPASSWORD=%s",
		`"password":"%s"`,
		"Authorization: Bearer %s",
		"authorization=Basic %s",
		"api_key=%s&x=1",
		// Issue 18, item 10: a secret word inside a longer key, env-var
		// and JSON forms, YAML, a quote in a URL's password.
		"access_token=%s",
		"client_secret=%s",
		"aws_secret_access_key=%s",
		"GITHUB_TOKEN=%s",
		"MYSQL_PWD=%s",
		`{"refresh_token":"%s"}`,
		"passphrase=%s",
		"session_token=%s",
		"private_key=%s",
		"amqp://u:s3'%s@h",
		"amqp://u:%s'\"x@h:5672/vhost",
		"db_password: %s",
		`{\"client_secret\": \"%s\"}`,
		"X-Api-Key: %s",
		"spring.datasource.password = %s;",
		"pass=%s",
		`{"pass":"%s"}`,
	}
	f.Fuzz(func(t *testing.T, before, secret, after string, form uint8) {
		// A secret is a run of password characters that none of the forms
		// would end early on; redaction of other shapes is not claimed.
		if len(secret) < 6 || !secretChars.MatchString(secret) || strings.Contains(before+diag.Mask+after, secret) {
			t.Skip()
		}
		tmpl := forms[int(form)%len(forms)]
		if strings.Contains(tmpl, "Bearer") || strings.Contains(tmpl, "Basic") {
			if !tokenChars.MatchString(secret) {
				t.Skip()
			}
		}
		in := before + " " + fmt.Sprintf(tmpl, secret) + " " + after
		if out := diag.Redact(in); strings.Contains(out, secret) {
			t.Fatalf("secret %q survives in %q (from %q)", secret, out, in)
		}
	})
}

var (
	secretChars = regexp.MustCompile(`^[A-Za-z0-9._~+/=!#$%^*()-]+$`)
	tokenChars  = regexp.MustCompile(`^[A-Za-z0-9._~+/=-]+$`)
)

// FuzzPrintable: whatever a message holds, what the CLI prints of it has no
// control byte and stays within its bound.
func FuzzPrintable(f *testing.F) {
	f.Add("\x1b]0;pwned\x07\x1b[2J title", 64)
	f.Add("ok \u202eevil\u202c \x9b31m", 8)
	f.Add("\xff\xfe\x00", 3)
	f.Fuzz(func(t *testing.T, s string, max int) {
		max = int(uint(max) % 4097)
		p := diag.Printable(s, max)
		if len(p) > max {
			t.Fatalf("%d bytes, max %d", len(p), max)
		}
		for _, r := range p {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
				t.Fatalf("control character %U in %q", r, p)
			}
		}
	})
}

// FuzzEscapeJSON: any string, encoded by encoding/json and escaped, decodes
// to the same string and holds no control character raw.
func FuzzEscapeJSON(f *testing.F) {
	f.Add("\x1b]0;pwned\x07 \u009b2J \u202eevil\u202c \u2066x\u2069 \x7f")
	f.Add("plain")
	f.Add("\xff\xfe\u2028")
	f.Fuzz(func(t *testing.T, s string) {
		raw, err := json.Marshal(map[string]string{s: s})
		if err != nil {
			t.Skip()
		}
		esc := diag.EscapeJSON(raw)
		for _, r := range string(esc) {
			if diag.Control(r) {
				t.Fatalf("control character %U in %q", r, esc)
			}
		}
		var want, got map[string]string
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(esc, &got); err != nil {
			t.Fatalf("%q no longer decodes: %v", esc, err)
		}
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("decodes to %q, want %q", got, want)
		}
	})
}

// FuzzTerminal: whatever is written, in whatever pieces, what reaches the
// writer beneath has no control character but newlines and tabs, and the
// same lines.
func FuzzTerminal(f *testing.F) {
	f.Add("ok\tcell\n\x1b[2J\u009b\u202e\n", uint8(1))
	f.Add("é日\u2066", uint8(2))
	f.Fuzz(func(t *testing.T, s string, piece uint8) {
		var buf strings.Builder
		term := diag.NewTerminal(&buf)
		step := int(piece%7) + 1
		for i := 0; i < len(s); i += step {
			if _, err := term.Write([]byte(s[i:min(i+step, len(s))])); err != nil {
				t.Fatal(err)
			}
		}
		if err := term.Flush(); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		for _, r := range out {
			if r != '\n' && r != '\t' && diag.Control(r) {
				t.Fatalf("control character %U in %q", r, out)
			}
		}
		if strings.Count(out, "\n") != strings.Count(s, "\n") {
			t.Fatalf("%d lines from %d", strings.Count(out, "\n"), strings.Count(s, "\n"))
		}
	})
}
