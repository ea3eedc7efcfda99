package sluice

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrUnpublishable is matched by a publisher's error for a message it cannot
// build for the wire as it is: a property value the broker's protocol
// cannot carry, a header name over its limit, a copy larger than a frame.
// Publishing the same message again fails the same way, so the retry-tier
// and poison stages never answer it with a nack (which would bring it back
// to the head of the queue, to fail again): the retry stage turns it into
// Poison, and the poison stage leaves out what cannot be carried.
var ErrUnpublishable = errors.New("sluice: the message cannot be published as it is")

// ErrPublishUncertain is matched by a publisher's error when it cannot say
// whether the broker stored the message: the confirm did not come within
// its timeout, the message context ended while waiting for it, or the
// channel or connection closed after the message was sent and before its
// confirm. The copy may be stored. A certain refusal — the broker nacked
// it, returned it as unroutable (a queue missing), or it was never sent —
// does not match it: the copy is not stored.
//
// The retry-tier and poison stages branch on it: after an uncertain
// publish they try no other tier and park no second copy (either could
// make two copies of one delivery); the delivery is nacked after the
// backoff, and the broker delivers it again (at least once). A copy made
// twice this way carries the same identity (CopyIDKey) both times.
var ErrPublishUncertain = errors.New("sluice: the publish is uncertain: the message may be stored")

// UnpublishableError is a message a publisher cannot build, naming the
// metadata key at fault when one is. Its text names the key (at most 64
// bytes of it) and the rule it breaks, never the offending value: it is
// meant for diagnoses and logs.
type UnpublishableError struct {
	// Key is the metadata key at fault; "" when the message as a whole is.
	Key string
	// Err is the rule the key or the message breaks, without the value.
	Err error
}

func (e *UnpublishableError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("%v: %v", ErrUnpublishable, e.Err)
	}
	return fmt.Sprintf("sluice: metadata %q cannot be published: %v", boundKey(e.Key), e.Err)
}

// Unwrap returns ErrUnpublishable and Err.
func (e *UnpublishableError) Unwrap() []error { return []error{ErrUnpublishable, e.Err} }

// boundKey cuts k to 64 bytes on a character boundary.
func boundKey(k string) string {
	const limit = 64
	if len(k) <= limit {
		return k
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(k[cut]) {
		cut--
	}
	return k[:cut] + "…"
}
