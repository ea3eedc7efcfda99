// Package diag turns errors and URLs into text that is safe to put into
// message headers, logs and error messages: bounded, valid UTF-8, with the
// passwords of URLs and DSNs replaced.
package diag

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Mask replaces every redacted secret.
const Mask = "xxxxx"

var (
	// scheme://user:password@host — the password part: everything after the
	// user's colon up to the last @ before a space, so a password may hold
	// unescaped @, :, /, quotes and any other character. (A later @ in the
	// same run of text, as in a path, takes the host with it: the safe side.)
	urlPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#\s"']*:)(\S*)@`)
	// A key that names a secret: a secret word anywhere in it — as a whole
	// word or after a prefix (PGPASSWORD, MYSQL_PWD, GITHUB_TOKEN,
	// access_token, client_secret, aws_secret_access_key, x-api-key,
	// spring.datasource.password) — with any further _, - or . separated
	// words (secret_access_key). A word that merely starts the same
	// ("tokens", "passwords", "compass") is not a key. The bare word
	// "pass" is a verb of prose ("… other arguments pass: x-queue-type
	// cannot be set …") before it is a key: it is one only after a prefix
	// (db_pass) or as bareKey says.
	secretKey = `\b(?:\w*(?:pass(?:word|wd|phrase)|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credentials?|signature)|\w*_pass)(?:[_.-]\w+)*`
	// The bare word "pass" as a key: pass=value (a DSN, an environment)
	// or quoted, "pass": value (JSON) — never "pass: value", which prose
	// writes with a word that is no secret after it.
	bareKey = `\bpass\s*=\s*|\\?"pass\\?"\s*:\s*|'pass'\s*:\s*`
	// key=value, key: value, "key":"value" (JSON, also escaped inside a
	// string: \"key\":\"value\"), key='quoted value' in DSNs,
	// environments, YAML and JSON. An unquoted value runs to a space or
	// one of "&;,}.
	kvPassword = regexp.MustCompile(`(?i)((?:\\?")?` + secretKey + `(?:\\?")?\s*[=:]\s*|` + bareKey + `)(\\"(?:[^"\\]|\\[^"])*(?:\\")?|'(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s"&;,}]+)`)
	// Authorization: Bearer token, Basic credentials, or a bare scheme.
	authorization = regexp.MustCompile(`(?i)(\b(?:authorization|proxy-authorization)"?\s*[=:]\s*"?(?:(?:bearer|basic|token|digest|negotiate)\s+)?)([^\s"',;}]+)`)
	bearer        = regexp.MustCompile(`(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]+)`)
)

// Redact replaces with Mask the passwords of URLs (scheme://user:pass@host,
// up to the last @ before a space); the values of key=value, key: value,
// key='quoted value' and "key":"value" pairs whose key names a secret
// (password, passwd, pwd, passphrase, secret, token, api_key, access_key,
// private_key, credential, signature — alone or within a longer key:
// PGPASSWORD, MYSQL_PWD, GITHUB_TOKEN, access_token, client_secret,
// aws_secret_access_key, session_token; pass after a prefix, db_pass, and
// alone only as pass=value or a quoted "pass" key: "pass: x" is prose, as
// in an error saying which declarations pass); and the credentials of
// Authorization headers and bearer tokens.
func Redact(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}"+Mask+"@")
	s = kvPassword.ReplaceAllStringFunc(s, func(m string) string {
		sub := kvPassword.FindStringSubmatch(m)
		v := sub[2]
		switch {
		case strings.HasPrefix(v, `\"`):
			return sub[1] + `\"` + Mask + `\"`
		case strings.HasPrefix(v, "'"):
			return sub[1] + "'" + Mask + "'"
		case strings.HasPrefix(v, `"`):
			return sub[1] + `"` + Mask + `"`
		}
		return sub[1] + Mask
	})
	s = authorization.ReplaceAllString(s, "${1}"+Mask)
	return bearer.ReplaceAllString(s, "${1}"+Mask)
}

// Error is an error whose text is redacted (Redact) and escaped (Escape),
// and which unwraps to the original, so errors.Is and errors.As still reach
// the cause (amqp091's *amqp.Error, amqp.ErrCredentials, ...). Only the text
// is changed: code that prints an unwrapped cause prints it as it is.
type Error struct {
	text string
	err  error
}

// RedactError returns err with its text redacted and escaped (Escape: no
// control character, so a log line or an error message quoting a message's
// contents cannot drive a terminal or forge a line), unwrapping to err; nil
// stays nil. A *url.Error from parsing (which repeats the whole URL, and for
// a bad escape a fragment of it) is described without the URL; one from a
// request (an http.Client's "Get URL: dial tcp …: connection refused")
// keeps its Op and its cause, with the URL's password replaced (RedactURL).
func RedactError(err error) error {
	if err == nil {
		return nil
	}
	ue, ok := errors.AsType[*url.Error](err)
	if !ok {
		return &Error{text: Escape(Redact(err.Error())), err: err}
	}
	var what string
	if ue.Op == "parse" {
		what = "not a valid URL"
		if _, isEscape := errors.AsType[url.EscapeError](ue.Err); isEscape {
			what = "not a valid URL: an invalid %-escape"
		} else if _, isHost := errors.AsType[url.InvalidHostError](ue.Err); isHost {
			what = "not a valid URL: an invalid character in the host"
		}
		what += " (the URL is not shown: it may hold a password)"
	} else {
		what = ue.Op + " " + RedactURL(ue.URL)
		if ue.Err != nil {
			what += ": " + Redact(ue.Err.Error())
		}
	}
	// What wraps the *url.Error ("listing the queues: …") is kept around it.
	text := what
	if full, own := err.Error(), ue.Error(); full != own {
		if before, after, found := strings.Cut(full, own); found {
			text = Redact(before) + what + Redact(after)
		}
	}
	return &Error{text: Escape(text), err: err}
}

func (e *Error) Error() string { return e.text }

// Unwrap returns the original error.
func (e *Error) Unwrap() error { return e.err }

// RedactURL returns u with its password replaced by Mask; a string that does
// not parse as a URL is redacted as text.
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		if strings.Contains(u, "@") {
			return "(an invalid URL with credentials, not shown)"
		}
		return Redact(u)
	}
	if p.User == nil {
		return Redact(u)
	}
	if _, ok := p.User.Password(); ok {
		p.User = url.UserPassword(p.User.Username(), Mask)
	}
	return p.String()
}

// Summary returns err's text redacted, made valid UTF-8 and cut to at most
// max bytes on a rune boundary (ending in "…" when cut). A nil err gives "".
func Summary(err error, max int) string {
	if err == nil {
		return ""
	}
	return Bound(Redact(err.Error()), max)
}

// Bound makes s valid UTF-8 (invalid bytes become U+FFFD), replaces NUL
// bytes and cuts it to at most max bytes on a rune boundary, ending in "…"
// when cut.
func Bound(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= max {
		return s
	}
	const ellipsis = "…"
	if max < len(ellipsis) {
		return ""
	}
	cut := max - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// Printable returns s made safe for a terminal (Escape) and bounded: cut
// to at most max bytes, ending in "…" when cut.
func Printable(s string, max int) string {
	if len(s) > 4*max+16 { // no need to escape what the cut drops
		s = s[:4*max+16]
	}
	return Bound(Escape(s), max)
}
