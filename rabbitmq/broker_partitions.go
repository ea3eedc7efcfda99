package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/diag"
)

var _ broker.Partitioned = (*Broker)(nil)

// ErrPartitioned is returned by the Subscribe of a partitioned Broker's
// own Endpoints: its messages are in the partition queues, consumed one
// handler per partition (Broker.Partitions).
var ErrPartitioned = errors.New("rabbitmq: a partitioned Broker has no queue of its own: consume each of its Partitions (router.Add does)")

// ErrNoPartitionKey is matched by PartitionPublisher's error for a message
// without its partition key header: the exchange could not hash it to a
// partition. It matches sluice.ErrUnpublishable (the outbox refuses to
// store such a message).
var ErrNoPartitionKey = errors.New("rabbitmq: the message has no value for the partition key header")

// Partitions returns one Broker per partition queue, in order, with
// TopologyConfig.Partitions; nil otherwise (consume Endpoints). Partition
// i's Endpoints have Topic PartitionQueue(Queue, i), a Subscriber of its
// own (Sluice's Consumer, or watermill-amqp's), the partition's Tiers
// (they return to it only), the shared poison queue, and the Broker's
// confirmed publisher. Closing a partition's Broker closes only its
// subscriber; Close the partitioned Broker after the router.
func (b *Broker) Partitions() []broker.Broker {
	if len(b.parts) == 0 {
		return nil
	}
	out := make([]broker.Broker, len(b.parts))
	for i, p := range b.parts {
		out[i] = p
	}
	return out
}

// PartitionPublisher returns the publisher producers use with
// TopologyConfig.Partitions: it publishes to the consistent-hash exchange,
// which puts each message in the partition its PartitionKey header hashes
// to; nil without Partitions. Closed by Close.
func (b *Broker) PartitionPublisher() *PartitionPublisher { return b.producer }

// newPartitions builds the partition Brokers of a partitioned b: each with
// a subscriber from newSub and the shared publisher.
func (b *Broker) newPartitions(newSub func(*Topology) (message.Subscriber, error)) error {
	for _, part := range b.topo.Partitions() {
		sub, err := newSub(part)
		if err != nil {
			return err
		}
		b.parts = append(b.parts, &Broker{topo: part, pub: b.pub, sub: sub, consumers: b.consumers, partition: true})
	}
	pub, err := NewPublisher(PublisherConfig{Connection: b.conn, Exchange: b.topo.Exchange()})
	if err != nil {
		return err
	}
	b.producer = &PartitionPublisher{pub: pub, exchange: b.topo.Exchange(), key: b.topo.PartitionKey()}
	b.sub = refusingSubscriber{}
	return nil
}

// refusingSubscriber is the subscriber of a partitioned Broker's own
// Endpoints.
type refusingSubscriber struct{}

func (refusingSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, ErrPartitioned
}

func (refusingSubscriber) Close() error { return nil }

// PartitionPublisher publishes to a partitioned topology's consistent-hash
// exchange: a confirmed, mandatory Publisher (PublisherConfig.Exchange)
// that refuses a message without its partition key header. It is safe for
// concurrent use.
type PartitionPublisher struct {
	pub           *Publisher
	exchange, key string
}

var (
	_ message.Publisher     = (*PartitionPublisher)(nil)
	_ broker.EachPublisher  = (*PartitionPublisher)(nil)
	_ broker.PublishChecker = (*PartitionPublisher)(nil)
)

// Exchange returns the exchange it publishes to: the topic to publish to.
func (p *PartitionPublisher) Exchange() string { return p.exchange }

// PartitionKey returns the header every message must carry.
func (p *PartitionPublisher) PartitionKey() string { return p.key }

// check refuses a topic other than the exchange and a message without its
// partition key.
func (p *PartitionPublisher) check(topic string, msg *message.Message) error {
	if topic != p.exchange {
		return fmt.Errorf("rabbitmq: PartitionPublisher publishes to the exchange %q, not to %q", p.exchange, diag.Bound(topic, 64))
	}
	if msg.Metadata.Get(p.key) == "" {
		return &sluice.UnpublishableError{Key: p.key, Err: fmt.Errorf("%w %q: set it to the key whose messages must stay in order", ErrNoPartitionKey, diag.Bound(p.key, 64))}
	}
	return nil
}

// Publish publishes msgs to the exchange, topic, and waits for each one's
// confirm (Publisher.Publish). A message without the partition key, or a
// topic other than Exchange, fails the call before anything is published.
func (p *PartitionPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := p.check(topic, m); err != nil {
			return fmt.Errorf("message %s: %w", diag.Bound(m.UUID, 64), err)
		}
	}
	return p.pub.Publish(topic, msgs...)
}

// PublishEach is Publish with one error per message (broker.EachPublisher):
// a message refused by the check is not published, the others are.
func (p *PartitionPublisher) PublishEach(topic string, msgs ...*message.Message) []error {
	errs := make([]error, len(msgs))
	var ok []*message.Message
	var at []int
	for i, m := range msgs {
		if errs[i] = p.check(topic, m); errs[i] == nil {
			ok, at = append(ok, m), append(at, i)
		}
	}
	if len(ok) > 0 {
		for j, err := range p.pub.PublishEach(topic, ok...) {
			errs[at[j]] = err
		}
	}
	return errs
}

// CheckPublish refuses, without publishing, what Publish would refuse for
// good: a message without the partition key, or one the broker could not
// carry (Publisher.CheckPublish).
func (p *PartitionPublisher) CheckPublish(topic string, msg *message.Message) error {
	if err := p.check(topic, msg); err != nil {
		return err
	}
	return p.pub.CheckPublish(topic, msg)
}

// Close closes the publisher.
func (p *PartitionPublisher) Close() error { return p.pub.Close() }
