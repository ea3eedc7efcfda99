package bench

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/rabbitmq"
)

// amqpAdmin declares, purges and deletes the suite's queues on a connection
// of its own, dialled again when the broker closed it (a chaos run on the
// shared broker closes connections; the publishers reconnect by themselves).
type amqpAdmin struct {
	url  string
	conn *amqp.Connection
}

func (a *amqpAdmin) do(f func(*amqp.Channel) error) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(time.Second)
		}
		if a.conn == nil || a.conn.IsClosed() {
			if a.conn, err = rabbitmq.Dial(rabbitmq.Connection{URL: a.url}, "sluice bench"); err != nil {
				continue
			}
		}
		var ch *amqp.Channel
		if ch, err = a.conn.Channel(); err != nil {
			continue
		}
		err = f(ch)
		_ = ch.Close()
		if err == nil {
			return nil
		}
	}
	return err
}

func (a *amqpAdmin) declare(queue string) error {
	return a.do(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	})
}

func (a *amqpAdmin) delete(queues ...string) {
	_ = a.do(func(ch *amqp.Channel) error {
		for _, q := range queues {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return err
			}
		}
		return nil
	})
}

func (a *amqpAdmin) close() {
	if a.conn != nil {
		_ = a.conn.Close()
	}
}
