// Package diag turns errors and URLs into text that is safe to put into
// message headers, logs and error messages: bounded, valid UTF-8, with the
// passwords of URLs and DSNs replaced.
package diag

import (
	"net/url"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Mask replaces every redacted secret.
const Mask = "xxxxx"

var (
	// scheme://user:password@host — the password part.
	urlPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:@/\s"']*:)([^@\s"']*)@`)
	// password=secret, pwd: secret, "password":"secret" in DSNs and JSON.
	kvPassword = regexp.MustCompile(`(?i)("?\b(?:password|passwd|pwd|secret|token|api[_-]?key)"?\s*[=:]\s*"?)([^\s"'&;,}]+)`)
)

// Redact replaces the passwords of URLs (scheme://user:pass@host) and of
// key=value or "key":"value" pairs (password, passwd, pwd, secret, token,
// api_key) with Mask.
func Redact(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}"+Mask+"@")
	return kvPassword.ReplaceAllString(s, "${1}"+Mask)
}

// RedactURL returns u with its password replaced by Mask; a string that does
// not parse as a URL is redacted as text.
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
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
