package dlq

import (
	"strings"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay"
)

// Identity is one dead letter's name wherever it is shown — sluice dlq
// inspect, report and replay, the console's group, preview and run pages:
// the business event id, the producer's message id, and the dead letter's
// own id.
type Identity struct {
	// EventID is the event id the copy carries (sluice_event_id: the
	// producer's, or the key the inbox took from the payload): "" when it
	// was isolated before its key was read (a malformed payload).
	EventID string
	// MessageID is the producer's AMQP message_id, kept on the copy.
	MessageID string
	// DeadLetter is the poison copy's own id (sluice_copy_id, its message
	// UUID), which the poison stage writes: the same on every read, put
	// back, archived and restored. On a message Sluice did not isolate (one
	// the broker dead-lettered) it is its Watermill UUID when a Watermill
	// producer wrote one, else "".
	DeadLetter string
}

// deadLetterPrefix starts the item of a dead letter without an event id.
const deadLetterPrefix = "dead letter "

// Identity returns m's identity.
func (m *Message) Identity() Identity {
	id := Identity{EventID: m.EventID, MessageID: m.Delivery.MessageId, DeadLetter: m.Msg.Metadata.Get(sluice.CopyIDKey)}
	if id.DeadLetter == "" && m.HeadersError == "" {
		id.DeadLetter, _ = m.Delivery.Headers[wamqp.DefaultMessageUUIDHeaderKey].(string) // where a Watermill producer writes its UUID
	}
	return id
}

// Name is how the dead letter is named first: "event <id>", else "dead
// letter <id>", else "message id <id>"; "" when it has none of them.
// Printable and bounded.
func (id Identity) Name() string {
	switch {
	case id.EventID != "":
		return "event " + diag.Printable(id.EventID, 128)
	case id.DeadLetter != "":
		return deadLetterPrefix + diag.Printable(id.DeadLetter, 64)
	case id.MessageID != "":
		return "message id " + diag.Printable(id.MessageID, 64)
	}
	return ""
}

// String is Name and then each other id it has: "event e-1 · dead letter
// 3f2a… · message id m-1".
func (id Identity) String() string {
	parts := []string{id.Name()}
	if id.EventID != "" && id.DeadLetter != "" {
		parts = append(parts, deadLetterPrefix+diag.Printable(id.DeadLetter, 64))
	}
	if (id.EventID != "" || id.DeadLetter != "") && id.MessageID != "" {
		parts = append(parts, "message id "+diag.Printable(id.MessageID, 64))
	}
	return strings.Join(parts, " · ")
}

// item is the identity as a replay run's item: the event id, else "dead
// letter <id>", else the message id; "" without any.
func (id Identity) item() string {
	switch {
	case id.EventID != "":
		return replayledger.Item(id.EventID)
	case id.DeadLetter != "":
		return replayledger.Item(deadLetterPrefix + id.DeadLetter)
	}
	return replayledger.Item(id.MessageID)
}

// RecordName names a run's record as Identity.Name names its dead letter:
// an item that is an event id is "event <id>"; a dead letter's item
// ("dead letter <id>") keeps its name, followed by the event id a consumer
// recorded for it once replayed (the key it took from the payload).
func RecordName(r replay.Record) string {
	if strings.HasPrefix(r.Item, deadLetterPrefix) {
		name := diag.Printable(r.Item, 128)
		if r.EventID != "" && r.EventID != r.Item {
			name += " · event " + diag.Printable(r.EventID, 128)
		}
		return name
	}
	return "event " + diag.Printable(r.Item, 128)
}
