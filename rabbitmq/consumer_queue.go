package rabbitmq

import (
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
)

// checkQueue returns an error matching ErrQueueNotFound, naming queue, when
// the broker says queue does not exist (a passive declare on a connection
// of its own, every call bounded: DialTimeout per node, then WriteTimeout).
// Any other failure — the broker unreachable at Subscribe — is left to the
// subscription, which reconnects with backoff.
func (c *Consumer) checkQueue(queue string) error {
	conn, _, err := c.cfg.dial("sluice consumer "+queue, 0)
	if err != nil {
		return nil
	}
	var declared error
	_ = closeWithin(conn, c.cfg.WriteTimeout, func() error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		if _, declared = ch.QueueDeclarePassive(queue, true, false, false, false, nil); declared == nil {
			return ch.Close()
		}
		return nil
	})
	_ = closeConn(conn, c.cfg.WriteTimeout)
	var ae *amqp.Error
	if errors.As(declared, &ae) && ae.Code == amqp.NotFound {
		return queueMissing(queue, true, declared)
	}
	return nil
}
