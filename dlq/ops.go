package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/replayledger"
)

// scanSelected scans queue and calls fn with each message f selects, at most
// limit (0: all) of them, counting Scanned and Selected into res; done runs
// as in scanQueue.
func scanSelected(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int, res *Result, fn func(*Message) error, done func() error) error {
	n, err := scanQueue(ctx, conn, queue, func(m *Message) (bool, error) {
		if limit > 0 && res.Selected >= limit {
			return true, nil
		}
		if !f.Match(m) {
			return false, nil
		}
		res.Selected++
		return false, fn(m)
	}, done)
	res.Scanned = n
	return err
}

// Publisher is what replay publishes with: it must return nil only for
// messages the broker stored and routed (rabbitmq.Publisher).
type Publisher interface {
	Publish(topic string, msgs ...*message.Message) error
}

// afterConfirmTimeout bounds what follows a confirmed publish.
const afterConfirmTimeout = 10 * time.Second

// afterConfirm is the context of what follows a confirmed publish — the
// record of what was sent, a restored row's mark: an interrupt (Ctrl-C)
// cancels ctx, and work left undone then would leave a message both
// published and where it came from. It is bounded instead.
func afterConfirm(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), afterConfirmTimeout)
}

// Result counts what an operation on a poison queue did — a replay, an
// archive, a discard, a restore: Scanned read, Selected by the filter, and
// Replayed moved (replayed, archived, discarded or restored), by target
// (the queue, or the archive's name).
type Result struct {
	Scanned  int            `json:"scanned"`
	Selected int            `json:"selected"`
	Replayed int            `json:"replayed"`
	ByTarget map[string]int `json:"by_target"`
	// Plan is, for a dry run, each selected message and its target.
	Plan []Planned `json:"plan,omitempty"`
}

// Planned is one message a dry run would replay.
type Planned struct {
	Message string `json:"message"` // "event <id>", or "message <uuid>" without an event id
	Target  string `json:"target"`
}

// name is how errors and plans name m: its identity's name (event, dead
// letter, message id), else its place.
func (m *Message) name() string {
	if n := m.Identity().Name(); n != "" {
		return n
	}
	if m.HeadersError != "" {
		return fmt.Sprintf("unreadable message at position %d (%d bytes)", m.Position, len(m.Msg.Payload))
	}
	return fmt.Sprintf("message at position %d (%d bytes)", m.Position, len(m.Msg.Payload))
}

// Item is m's item in a replay run (and in the records of a discard, an
// archive): its event id, else "dead letter <its id>", else its message
// id, as replayledger.Item bounds it — its Identity, so that a run's page names
// it as the group page and inspect do (RecordName).
//
// A message with none of them has no stable name but its place: "message
// at position 3 (120 bytes)".
func (m *Message) Item() string {
	if it := m.Identity().item(); it != "" {
		return it
	}
	return replayledger.Item(m.name())
}

// ArchiveRecord is one line of an archive file: the message, where it was
// archived from (Queue, the poison queue: where restore publishes it back),
// and its digest and signature.
type ArchiveRecord struct {
	ArchivedAt    time.Time         `json:"archived_at"`
	ArchivedBy    string            `json:"archived_by"`
	Queue         string            `json:"queue"`
	UUID          string            `json:"uuid"`
	Class         string            `json:"class"`
	Reason        string            `json:"reason"`
	EventID       string            `json:"event_id"`
	EventType     string            `json:"event_type"`
	Metadata      map[string]string `json:"metadata"`
	Payload       string            `json:"payload,omitempty"`
	PayloadBase64 string            `json:"payload_base64,omitempty"`
	// Digest is "sha256:" and the hex SHA-256 of the other fields
	// (canonical): a record damaged, cut short or edited without
	// recomputing it is refused. It proves nothing against someone who
	// recomputes it: that is the Signature's part.
	Digest string `json:"digest,omitempty"`
	// Signature is the HMAC-SHA256 of the same fields under the signing
	// key (signing.Signer, as the stages' copies carry it), when archive was
	// given one.
	Signature string `json:"signature,omitempty"`
}
