package rabbitmq

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/poisonqueue"
)

// partitionsMax is the most partition queues TopologyConfig.Partitions
// declares: each is a queue family of its own (the queue and its tiers),
// and a consumer keeps a connection per partition it consumes.
const partitionsMax = 1024

// exchangeConsistentHash is the type of a partitioned topology's exchange,
// from RabbitMQ's plugin rabbitmq_consistent_hash_exchange (bundled with
// RabbitMQ 3.x and 4.x, disabled by default).
const exchangeConsistentHash = "x-consistent-hash"

// partitionWeight is the binding key of each partition queue to the
// consistent-hash exchange: its weight on the hash ring, the same for all,
// so that keys spread evenly.
const partitionWeight = "1"

// ErrConsistentHashPlugin is matched by the error of declaring a
// partitioned topology on a broker without the plugin
// rabbitmq_consistent_hash_exchange (RabbitMQ refuses the exchange type
// — 503 COMMAND_INVALID on 3.x, 406 PRECONDITION_FAILED on 4.x — and
// closes the connection or the channel).
var ErrConsistentHashPlugin = errors.New("rabbitmq: the broker has no exchange type " + exchangeConsistentHash +
	": enable the plugin on every node with `rabbitmq-plugins enable rabbitmq_consistent_hash_exchange` (no restart needed)")

// PartitionQueue returns the name of partition i of queue: "<queue>.p<i>".
func PartitionQueue(queue string, i int) string { return queue + partitionSuffix(i) }

func partitionSuffix(i int) string { return ".p" + strconv.Itoa(i) }

// newPartitioned validates a topology with cfg.Partitions > 0: an exchange
// of type x-consistent-hash hashing the header PartitionKey, and one queue
// family per partition (PartitionQueue, its tiers), each queue declared
// with single active consumer; the poison queue is shared.
func newPartitioned(cfg TopologyConfig) (*Topology, error) {
	switch {
	case cfg.Partitions < 0 || cfg.Partitions > partitionsMax:
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.Partitions %d: want 1 to %d partition queues (0: none)", cfg.Partitions, partitionsMax)
	case cfg.Partitions == 0:
		return nil, errors.New("rabbitmq: TopologyConfig.PartitionKey is set without Partitions: set Partitions, the number of partition queues")
	case cfg.PartitionKey == "":
		return nil, errors.New("rabbitmq: TopologyConfig.PartitionKey is required with Partitions: the header whose value the exchange hashes to choose a partition (its hash-header), which producers set")
	case cfg.Queue == "":
		return nil, errors.New("rabbitmq: TopologyConfig.Queue is required")
	case cfg.ExchangeType != "" && cfg.ExchangeType != exchangeConsistentHash:
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.ExchangeType %q: with Partitions the exchange is of type %s", cfg.ExchangeType, exchangeConsistentHash)
	case cfg.BindingKey != "":
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.BindingKey is set: with Partitions each partition queue is bound with its weight, %q", partitionWeight)
	}
	if err := broker.CheckName("TopologyConfig.PartitionKey", cfg.PartitionKey); err != nil {
		return nil, err
	}
	if err := checkQueueName("Queue", cfg.Queue); err != nil {
		return nil, err
	}
	limit := maxQueueLength(cfg.TierDelays, false) - len(partitionSuffix(cfg.Partitions-1))
	if cfg.PoisonQueue == "" {
		limit = min(limit, broker.NameMaxLength-len(poisonqueue.Suffix))
	}
	if len(cfg.Queue) > limit {
		return nil, fmt.Errorf("%w: TopologyConfig.Queue is %d bytes; with %d partitions and these tiers it may be at most %d, so that its partition queues (%s), their tier queues and the poison queue fit",
			broker.ErrNameTooLong, len(cfg.Queue), cfg.Partitions, limit, PartitionQueue("<Queue>", cfg.Partitions-1))
	}
	cfg.Exchange = cmp.Or(cfg.Exchange, cfg.Queue)
	if err := checkQueueName("Exchange", cfg.Exchange); err != nil {
		return nil, err
	}
	cfg.ExchangeType = exchangeConsistentHash
	cfg.PoisonQueue = cmp.Or(cfg.PoisonQueue, cfg.Queue+poisonqueue.Suffix)
	if err := checkQueueName("PoisonQueue", cfg.PoisonQueue); err != nil {
		return nil, err
	}
	if cfg.DeliveryLimit < 0 || cfg.DeliveryLimit > 0 && !cfg.Quorum {
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.DeliveryLimit %d: want 0, or a positive limit on a quorum queue", cfg.DeliveryLimit)
	}
	t := &Topology{cfg: cfg}
	names := map[string]bool{cfg.PoisonQueue: true}
	for i := range cfg.Partitions {
		sub := cfg
		sub.Queue = PartitionQueue(cfg.Queue, i)
		sub.Partitions, sub.PartitionKey, sub.Exchange, sub.ExchangeType, sub.BindingKey = 0, "", "", "", ""
		part, err := NewTopology(sub)
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: partition %d (%s): %w", i, sub.Queue, err)
		}
		part.single = true
		for _, q := range part.Queues() {
			if q.Role != RolePoison && names[q.Name] {
				return nil, fmt.Errorf("rabbitmq: TopologyConfig.PoisonQueue %q is also a queue of partition %d: want a queue of its own", cfg.PoisonQueue, i)
			}
			names[q.Name] = true
		}
		t.parts = append(t.parts, part)
	}
	t.cfg = withTierDefaults(t.cfg, t.parts[0].tiers)
	return t, nil
}

// Partitions returns the topology of each partition queue, in order
// (nil without TopologyConfig.Partitions): its Config().Queue is
// PartitionQueue(Queue, i), its Tiers return to it only, and its
// PoisonQueue is the topology's, shared by every partition. A consumer of
// partition i consumes its Queue; a producer publishes to Exchange.
func (t *Topology) Partitions() []*Topology { return append([]*Topology(nil), t.parts...) }

// exchangeArgs are the arguments of the exchange's declaration.
func (t *Topology) exchangeArgs() amqp.Table {
	if len(t.parts) == 0 {
		return nil
	}
	return amqp.Table{"hash-header": t.cfg.PartitionKey}
}

// binding is a queue bound to the topology's exchange.
type binding struct {
	queue, key string // with Partitions, key is the queue's weight
}

// bindings are the bindings Declare declares: Queue with BindingKey, or
// with Partitions each partition queue with its weight, "1". None without
// an Exchange.
func (t *Topology) bindings() []binding {
	switch {
	case t.cfg.Exchange == "":
		return nil
	case len(t.parts) == 0:
		return []binding{{queue: t.cfg.Queue, key: t.cfg.BindingKey}}
	}
	bs := make([]binding, 0, len(t.parts))
	for _, p := range t.parts {
		bs = append(bs, binding{queue: p.cfg.Queue, key: partitionWeight})
	}
	return bs
}

// exchangeError is the error of declaring the exchange: a missing
// consistent-hash plugin says so.
func (t *Topology) exchangeError(err error) error {
	// RabbitMQ 3.x refuses an unknown type with 503 COMMAND_INVALID, 4.x
	// with 406 PRECONDITION_FAILED; both say "unknown exchange type".
	var ae *amqp.Error
	if len(t.parts) > 0 && errors.As(err, &ae) && (ae.Code == amqp.CommandInvalid || strings.Contains(ae.Reason, "exchange type")) {
		return fmt.Errorf("%w (declaring exchange %q: %d %s)", ErrConsistentHashPlugin, t.cfg.Exchange, ae.Code, ae.Reason)
	}
	return conflict("exchange", t.cfg.Exchange, err)
}

// partitionedSpecs are the queues of a partitioned topology: each
// partition's queue and tiers, then the shared poison queue.
func (t *Topology) partitionedSpecs() []queueSpec {
	var specs []queueSpec
	for _, p := range t.parts {
		ps := p.specs()
		specs = append(specs, ps[:len(ps)-1]...)
	}
	ps := t.parts[0].specs()
	return append(specs, ps[len(ps)-1])
}

// partitionRange names the partition queues of queue: "q.p0 … q.p3".
func partitionRange(queue string, n int) string {
	if n == 1 {
		return PartitionQueue(queue, 0)
	}
	return PartitionQueue(queue, 0) + " … " + PartitionQueue(queue, n-1)
}
