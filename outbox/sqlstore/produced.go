package sqlstore

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/unitofwork"
	"github.com/sluicemq/sluice/internal/metakeys"
)

// ownHistory makes m a message of its own, not a continuation of the
// delivery being handled, whose metadata a handler often copies into what
// it produces (correlation, tracing; msg.Copy() to forward it):
//   - it carries none of Sluice's control headers (sluice.IsControlKey: the
//     attempt, the failures, the origin, the poison diagnosis, the replay
//     marks, the signature) nor the dead-letter facts of a delivery: a
//     forwarded copy does not bring its retry history to the queue it goes
//     to, where a signing key shared between services would make it
//     believed;
//   - an event id equal to the delivery's (sluice.EventIDKey, copied with
//     the rest) is replaced by a new one, so the receiving inbox does not
//     take a fan-out's messages for duplicates of one another. An event id
//     the handler set on purpose — any other — is kept.
func ownHistory(ctx context.Context, m *message.Message) {
	for k := range m.Metadata {
		if sluice.IsControlKey(k) || k == metakeys.DeadLetterQueue || k == metakeys.DeadLetterReason {
			delete(m.Metadata, k)
		}
	}
	if id := unitofwork.EventID(ctx); id != "" && m.Metadata.Get(sluice.EventIDKey) == id {
		m.Metadata.Set(sluice.EventIDKey, watermill.NewUUID())
	}
}

// checkPublish returns, classified sluice.Poison, the Checker's refusal of
// message i, to topic: what can never be published is not written.
func (s *Store) checkPublish(topic string, i int, m *message.Message) error {
	if s.check == nil {
		return nil
	}
	if err := s.check.CheckPublish(topic, m); err != nil {
		return sluice.Poison(fmt.Errorf("outbox/sqlstore: message %d (%s) to %q cannot be published, not written: %w", i, diag.Printable(m.UUID, 64), topic, err))
	}
	return nil
}
