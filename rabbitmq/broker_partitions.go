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

// errPartitioned is returned by the Subscribe of a partitioned Broker's
// own Endpoints: its messages are in the partition queues, consumed one
// handler per partition (Broker.Partitions).
var errPartitioned = errors.New("rabbitmq: a partitioned Broker has no queue of its own: consume each of its Partitions (router.Add does)")

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
// TopologyConfig.Partitions: it publishes to the consistent-hash exchange
// (Topology().Config().Exchange, the one topic it takes), which puts each
// message in the partition its PartitionKey header hashes to; nil without
// Partitions. It is the confirmed, mandatory Publisher, except that it
// refuses a topic other than the exchange, and a message without the
// partition key header (ErrNoPartitionKey): Publish fails the call before
// anything is published, PublishEach refuses that message alone, and
// CheckPublish refuses it too. Closed by Close.
func (b *Broker) PartitionPublisher() *Publisher { return b.producer }

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
	pub, err := NewPublisher(PublisherConfig{Connection: b.conn, Exchange: b.topo.cfg.Exchange})
	if err != nil {
		return err
	}
	pub.partitionKey = b.topo.cfg.PartitionKey
	b.producer = pub
	b.sub = refusingSubscriber{}
	return nil
}

// refusingSubscriber is the subscriber of a partitioned Broker's own
// Endpoints.
type refusingSubscriber struct{}

func (refusingSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, errPartitioned
}

func (refusingSubscriber) Close() error { return nil }

// checkPartition refuses, for a Broker's PartitionPublisher (partitionKey
// set), a topic other than the exchange and a message without its
// partition key.
func (p *Publisher) checkPartition(topic string, msg *message.Message) error {
	if p.partitionKey == "" {
		return nil
	}
	if topic != p.cfg.Exchange {
		return fmt.Errorf("rabbitmq: PartitionPublisher publishes to the exchange %q, not to %q", p.cfg.Exchange, diag.Bound(topic, 64))
	}
	if msg.Metadata.Get(p.partitionKey) == "" {
		return &sluice.UnpublishableError{Key: p.partitionKey, Err: fmt.Errorf("%w %q: set it to the key whose messages must stay in order", ErrNoPartitionKey, diag.Bound(p.partitionKey, 64))}
	}
	return nil
}

// publishPartitioned is a PartitionPublisher's PublishEach: a message
// refused by checkPartition is not published, the others are.
func (p *Publisher) publishPartitioned(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	var ok []*message.Message
	var at []int
	for i, m := range msgs {
		if errs[i] = p.checkPartition(topic, m); errs[i] == nil {
			ok, at = append(ok, m), append(at, i)
		}
	}
	if len(ok) > 0 {
		for j, err := range p.publishEach(topic, ok) {
			errs[at[j]] = err
		}
	}
	return errs
}
