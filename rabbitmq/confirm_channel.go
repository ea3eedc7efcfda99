package rabbitmq

import (
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// confirmChannel is a channel in confirm mode whose basic.returns are matched
// to publishes by PublishIDHeader.
//
// RabbitMQ sends a mandatory message's basic.return before its basic.ack on
// the same channel, and amqp091's reader hands the return to listen over an
// unbuffered channel before it reads the ack. So once a publish is confirmed,
// a round trip through listen (sync) guarantees its return, if any, has been
// recorded.
type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
	barrier chan chan struct{}
	done    chan struct{} // closed when listen ends: the channel is closed

	mu       sync.Mutex
	returned map[string]*UnroutableError // by publish id; nil value: in flight
}

func newConfirmChannel(conn *amqp.Connection) (*confirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: opening a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("rabbitmq: enabling publisher confirms: %w", err)
	}
	c := &confirmChannel{
		ch:       ch,
		returns:  ch.NotifyReturn(make(chan amqp.Return)),
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		barrier:  make(chan chan struct{}),
		done:     make(chan struct{}),
		returned: make(map[string]*UnroutableError),
	}
	go c.listen()
	return c, nil
}

func (c *confirmChannel) listen() {
	defer close(c.done)
	returns := c.returns
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			id, _ := r.Headers[PublishIDHeader].(string)
			c.mu.Lock()
			if _, inflight := c.returned[id]; inflight {
				c.returned[id] = &UnroutableError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, ReplyCode: r.ReplyCode, ReplyText: r.ReplyText}
			}
			c.mu.Unlock()
		case reply := <-c.barrier:
			close(reply)
		case <-c.closes:
			// amqp091 closes the return channels on shutdown, after every
			// return that arrived was handed over.
			return
		}
	}
}

func (c *confirmChannel) publish(id, exchange, key string, pub amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	c.mu.Lock()
	c.returned[id] = nil
	c.mu.Unlock()
	dc, err := c.ch.PublishWithDeferredConfirm(exchange, key, true, false, pub)
	if err != nil {
		c.mu.Lock()
		delete(c.returned, id)
		c.mu.Unlock()
	}
	return dc, err
}

// settle forgets publish id and returns its basic.return, if one came. With
// confirmed set, it first waits until every return that preceded the
// confirm has been recorded.
func (c *confirmChannel) settle(id string, confirmed bool) *UnroutableError {
	if confirmed {
		reply := make(chan struct{})
		select {
		case c.barrier <- reply:
			<-reply
		case <-c.done:
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ret := c.returned[id]
	delete(c.returned, id)
	return ret
}

func (c *confirmChannel) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return c.ch.IsClosed()
	}
}

func (c *confirmChannel) close() {
	_ = c.ch.Close()
	<-c.done
}
