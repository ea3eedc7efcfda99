package sluice

import (
	"strings"

	"github.com/sluicemq/sluice/internal/metakeys"
)

// Everything a producer sends is hostile, headers that look like Sluice's
// own included. Sluice's control headers — the attempt and failure history
// (AttemptKey, FirstFailedAtKey, LastErrorKey, RetryTierKey,
// PreviousTraceparentKey, the origin keys sluice_origin_*), the poison diagnosis and its
// parked mark (sluice_poison_*), the replay run and item (sluice_replay_*) —
// are believed only when Sluice wrote them. Each stage removes, on the way
// in, the control headers it acts on unless the delivery proves it:
//
//   - with a signer (package signing: a key given to the stages and to the
//     operator's CLI):
//     SignatureKey verifies for the consumer's queue the stage serves — an
//     HMAC-SHA256 over that queue, the payload, the event id and type and
//     every control header, which the stages and the CLI set on each copy
//     they publish, for the queue the copy's history belongs to (the one it
//     comes back to, or is replayed to). A delivery whose signature does
//     not verify — forged, or made for another queue: a copy a handler
//     forwards (msg.Copy()) to another service's queue, or replays onto
//     another queue — keeps none of its control headers, and is a first
//     delivery there. A signature written before signatures named their
//     queue (v1, ErrUnboundSignature) is believed only on a copy back from
//     the queue's own tier, as x-death shows it.
//   - without one: the delivery came back dead-lettered from one of the
//     consumer's own tier queues (sluice_amqp_last_death_queue, reason
//     expired) — what x-death shows for a copy that waited in a tier. This
//     stops a producer that writes Sluice's headers into its message; one
//     that can also write x-death (RabbitMQ 3.x keeps a publisher's) or
//     publish into a tier queue is stopped only by a key.
//
// See docs/architecture.md, "Trust boundary".

// SignatureKey is the header of the signature a signing.Signer sets: "v2:"
// and the HMAC-SHA256, unpadded base64url ("v1:" before signatures named
// their queue).
const SignatureKey = "sluice_sig"

// IsControlKey reports whether k is one of Sluice's control keys: the ones a
// signing.Signer signs, and a stage believes only when Sluice wrote them.
func IsControlKey(k string) bool {
	return IsRetryKey(k) || k == SignatureKey || strings.HasPrefix(k, metakeys.PoisonPrefix) || strings.HasPrefix(k, metakeys.ReplayPrefix)
}

// IsRetryKey reports whether k is a control key of the retry history — the
// attempt, the failures, the tier, the origin — which the retry-tier stage
// believes only on a copy Sluice wrote.
func IsRetryKey(k string) bool {
	switch k {
	case AttemptKey, FirstFailedAtKey, LastErrorKey, RetryTierKey, PreviousTraceparentKey:
		return true
	}
	return strings.HasPrefix(k, metakeys.OriginPrefix)
}
