package republish

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// The kinds of copies a delivery makes: each has an identity of its own.
const (
	KindRetry  = "retry"  // a retry copy, whichever tier takes it
	KindPoison = "poison" // the diagnosed copy, in the poison queue or parked
)

// ID is the identity of the copy of kind that msg's delivery makes: the
// same for every delivery of one message — a redelivery after a nack, the
// same copy tried in another tier — so that a copy made twice (an
// uncertain publish, sluice.ErrPublishUncertain, then the redelivery's
// publish) is recognised as one. It is a UUID (version 8, RFC 9562) from a
// SHA-256 of:
//   - kind;
//   - the event (sluice.EventIDKey), else msg's UUID — on RabbitMQ the
//     producer's _watermill_message_uuid, else its message_id; on a copy,
//     the copy's own ID, so a chain of copies stays deterministic;
//   - the attempt that failed (sluice.AttemptKey, as msg carries it);
//   - the handler and the topic it consumes (two consumers of one event
//     make two copies);
//   - the replay keys (sluice_replay_*: run, item, count, when), so
//     that a replayed message's new copies are new items.
//
// A message with no event id, no UUID header and no message_id gets a new
// UUID on each delivery: its copies cannot be recognised.
func ID(msg *message.Message, kind string) string {
	h := sha256.New()
	field(h, "sluice-copy-v1")
	field(h, kind)
	md := msg.Metadata
	if id := md[sluice.EventIDKey]; id != "" {
		field(h, "event")
		field(h, id)
	} else {
		field(h, "message")
		field(h, msg.UUID)
	}
	attempt := md[sluice.AttemptKey]
	if n, err := sluice.Attempt(msg); err == nil {
		attempt = strconv.Itoa(n)
	}
	field(h, attempt)
	field(h, telemetry.Handler(msg.Context()))
	field(h, message.SubscribeTopicFromCtx(msg.Context()))
	var replay []string
	for k := range md {
		if strings.HasPrefix(k, metakeys.ReplayPrefix) {
			replay = append(replay, k)
		}
	}
	slices.Sort(replay)
	for _, k := range replay {
		field(h, k)
		field(h, md[k])
	}
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // variant 10
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Identify gives c, a copy of msg, the identity of its kind (ID): its UUID
// (on RabbitMQ, the _watermill_message_uuid header, which the Marshaler
// reads back as the message's UUID) and sluice.CopyIDKey. Call it before
// the copy is signed.
func Identify(c, msg *message.Message, kind string) {
	id := ID(msg, kind)
	c.UUID = id
	c.Metadata[sluice.CopyIDKey] = id
}

// field writes s to h, length-prefixed.
func field(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}
