package embedded

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
)

// UnfinishedError counts and names the deliveries the embedded broker did
// not see acked by the time it closed: the error of Broker.Close (and
// PubSub.Close) when deliveries were not acked, matched with errors.As. It
// holds the stored copies (payload and metadata), so a caller can keep them
// — publish them again on the next run — instead of losing them with the
// process: Queued, InFlight and Tiers, in that order.
type UnfinishedError struct {
	// Queued were never handed out, or were nacked back (a shutdown, a
	// delivery held by the brake, a retry tier full): unprocessed.
	Queued []*message.Message
	// InFlight were still in a handler when the drain timed out: neither
	// acked nor nacked, and possibly finished afterwards.
	InFlight []*message.Message
	// Tiers are the retry tiers' copies not delivered back: still waiting
	// for their delay at Close, or refused by the topic (the delivery
	// they retry was acked: they are not in Queued).
	Tiers []*message.Message

	tiersWaiting int // of Tiers, those still waiting at Close
}

// unfinishedNamed is how many deliveries the error's text names.
const unfinishedNamed = 10

func (e *UnfinishedError) Error() string {
	all := append(append([]*message.Message(nil), e.Queued...), e.InFlight...)
	names := make([]string, 0, min(len(all), unfinishedNamed))
	for _, m := range all[:min(len(all), unfinishedNamed)] {
		names = append(names, diag.Escape(cmp.Or(m.Metadata.Get(sluice.EventIDKey), m.UUID)))
	}
	more := ""
	if len(all) > unfinishedNamed {
		more = fmt.Sprintf(" and %d more", len(all)-unfinishedNamed)
	}
	tiers := ""
	if len(e.Tiers) > 0 {
		tiers = fmt.Sprintf("; the delayed publisher dropped %d retry copies (handed back in Tiers): %d still waiting at Close, %d refused by the target",
			len(e.Tiers), e.tiersWaiting, len(e.Tiers)-e.tiersWaiting)
	}
	return fmt.Sprintf("embedded: embedded deliveries not finished at Close: %d deliveries not acked (not durable: lost unless kept from this error): %d queued or nacked back, %d still in a handler: %s%s%s",
		len(all), len(e.Queued), len(e.InFlight), strings.Join(names, ", "), more, tiers)
}

// merge returns one error holding the messages of both (either may be nil).
func merge(a, b *UnfinishedError) *UnfinishedError {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return &UnfinishedError{Queued: append(a.Queued, b.Queued...), InFlight: append(a.InFlight, b.InFlight...),
		Tiers: append(a.Tiers, b.Tiers...), tiersWaiting: a.tiersWaiting + b.tiersWaiting}
}
