package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"slices"
	"time"

	"github.com/sluicemq/sluice/internal/diag"

	"github.com/sluicemq/sluice/replay"
)

// Filter selects messages by their diagnosis; the zero Filter selects all.
type Filter struct {
	Classes    []string       // sluice_poison_class is one of these
	ErrorMatch *regexp.Regexp // matches sluice_poison_reason
	EventTypes []string       // sluice_event_type is one of these
	Since      time.Time      // poisoned at or after
	Until      time.Time      // poisoned before
	// NotRun leaves out the messages a replay run already replayed (they
	// carry its replay.RunKey): a copy poisoned again is not replayed twice
	// by the same run.
	NotRun string
	// Unreadable selects only the messages whose headers the AMQP client
	// could not parse (Message.HeadersError).
	Unreadable bool
	// Group selects only the messages of this failure group (Message.Group).
	Group string
}

// Match reports whether the filter selects m. A message without a valid
// poisoned-at time is not selected by a time bound.
func (f Filter) Match(m *Message) bool {
	switch {
	case len(f.Classes) > 0 && !slices.Contains(f.Classes, m.Class):
		return false
	case f.ErrorMatch != nil && !f.ErrorMatch.MatchString(m.Reason):
		return false
	case len(f.EventTypes) > 0 && !slices.Contains(f.EventTypes, m.EventType):
		return false
	case !f.Since.IsZero() && (m.PoisonedAt.IsZero() || m.PoisonedAt.Before(f.Since)):
		return false
	case !f.Until.IsZero() && (m.PoisonedAt.IsZero() || !m.PoisonedAt.Before(f.Until)):
		return false
	case f.NotRun != "" && m.Msg.Metadata.Get(replay.RunKey) == f.NotRun:
		return false
	case f.Unreadable && m.HeadersError == "":
		return false
	case f.Group != "" && m.Group() != f.Group:
		return false
	}
	return true
}

// Describe returns the filter's settings, for the audit record.
func (f Filter) Describe() map[string]string {
	d := map[string]string{}
	if len(f.Classes) > 0 {
		d["class"] = joinComma(f.Classes)
	}
	if f.ErrorMatch != nil {
		d["error_match"] = f.ErrorMatch.String()
	}
	if f.Group != "" {
		d["group"] = f.Group
	}
	if len(f.EventTypes) > 0 {
		d["event_type"] = joinComma(f.EventTypes)
	}
	if !f.Since.IsZero() {
		d["since"] = f.Since.UTC().Format(time.RFC3339)
	}
	if !f.Until.IsZero() {
		d["until"] = f.Until.UTC().Format(time.RFC3339)
	}
	if f.Unreadable {
		d["unreadable"] = "true"
	}
	return d
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}

var (
	uuidRe   = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	longHex  = regexp.MustCompile(`(?i)\b[0-9a-f]{16,}\b`)
	numberRe = regexp.MustCompile(`\d+`)
)

// Fingerprint is an error summary with its ids and numbers replaced, so
// that messages failing the same way group together: "order o-404 must
// exist" and "order o-17 must exist" both give "order o-# must exist".
func Fingerprint(reason string) string {
	s := uuidRe.ReplaceAllString(reason, "<uuid>")
	s = longHex.ReplaceAllString(s, "<hex>")
	return numberRe.ReplaceAllString(s, "#")
}

// groupReasonMax bounds the part of a reason Group reads: a hostile
// producer's megabyte reason costs no more than a short one.
const groupReasonMax = 1024

// Group returns m's failure group: 16 hex digits of a hash of its class,
// its reason's Fingerprint and its consumer — one group per kind of failure
// of one handler, however many messages share it.
func (m *Message) Group() string {
	h := sha256.Sum256([]byte(m.Class + "\x00" + Fingerprint(diag.Bound(m.Reason, groupReasonMax)) + "\x00" + m.Consumer))
	return hex.EncodeToString(h[:8])
}
