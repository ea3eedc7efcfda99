package sqlstore

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
)

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
