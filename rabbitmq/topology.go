package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/poisonqueue"
)

// TopologyConfig describes the queues of one consumer queue.
type TopologyConfig struct {
	// Queue is the consumer's queue. Required: [A-Za-z0-9_.:-], not
	// starting with "amq.", and short enough that every derived name fits
	// AMQP's 255 bytes: at most 255 minus the longest suffix, which is
	// ".retry.<delay>" (10 bytes with the default tiers: 245) or ".poison"
	// (7) when PoisonQueue is left to its default. NewTopology's error
	// names the limit.
	Queue string
	// TierDelays are the retry tiers' TTLs, in order, each at least 1ms and
	// at most 24 days, no two with one name. Default
	// 30s, 5m, 30m. Each tier is the queue
	// broker.TierTopic(Queue, delay): "<Queue>.retry.<delay>". A tier's copy
	// survives a broker crash on its way back to Queue only with Quorum.
	TierDelays []time.Duration
	// TierJitter spreads each tier's copies over TierJitter.Queues queues
	// of their own, with TTLs evenly spread from the tier's delay down to
	// delay × (1 − TierJitter.Fraction), each named for its TTL
	// ("<Queue>.retry.4m40s"), so that what an outage sent to a tier does
	// not come back at once (broker.Jittered says why one queue cannot
	// jitter). Default none: one queue per tier.
	TierJitter broker.Jitter
	// PoisonQueue receives what the poison stage isolates and, for a quorum
	// Queue, what the broker dead-letters. Default "<Queue>.poison". A
	// quorum PoisonQueue is declared with x-delivery-limit
	// 2147483647, so that reading it (sluice dlq inspect, stats)
	// neither drops nor reorders it.
	PoisonQueue string
	// Quorum declares every queue as a quorum queue instead of a classic one.
	// Quorum is the choice for durability: a quorum tier dead-letters its
	// expired copies back to Queue at least once (declared with
	// x-dead-letter-strategy=at-least-once and x-overflow=reject-publish,
	// as is Queue toward PoisonQueue: the broker keeps the copy until Queue
	// has confirmed it). A classic tier dead-letters at most once: a broker
	// crash or a node lost while an expired copy is on its way back to Queue
	// loses the copy, and the retry stage acked the original when the copy
	// was confirmed into the tier — the event is gone. Classic queues also
	// live on one node. Default false (classic, what watermill-amqp
	// declares).
	Quorum bool
	// DeliveryLimit (quorum only) dead-letters a message to PoisonQueue after
	// this many failed deliveries: the backstop for a message that kills the
	// process before any middleware can act. 0 declares no x-delivery-limit
	// on Queue, which means the broker's default: none on RabbitMQ 3.x, 20 on
	// 4.x (since 4.0 every quorum queue has a limit). Set it: 20 is what the
	// examples use.
	DeliveryLimit int
	// Exchange, when set, is declared (durable, ExchangeType) and Queue is
	// bound to it with BindingKey. The tier queues are never bound to it.
	// With Partitions, the consistent-hash exchange; default Queue.
	Exchange string
	// ExchangeType of Exchange. Default "topic"; with Partitions
	// "x-consistent-hash", the only type accepted.
	ExchangeType string
	// BindingKey binds Queue to Exchange. Default Queue. Refused with
	// Partitions (each partition queue is bound with its weight, "1").
	BindingKey string
	// Partitions, when positive, spreads the messages over this many
	// partition queues by the value of their header PartitionKey, for
	// order per key across instances: Exchange (default Queue) is declared
	// of type "x-consistent-hash" (the plugin
	// rabbitmq_consistent_hash_exchange; without it Declare fails with an
	// error matching ErrConsistentHashPlugin) with the argument
	// hash-header=PartitionKey, and each partition queue
	// PartitionQueue(Queue, i) ("<Queue>.p<i>", i from 0) is a queue
	// family of its own — its tiers "<Queue>.p<i>.retry.<delay>" return to
	// it only — declared with x-single-active-consumer=true, so that one
	// consumer at a time, in one instance, receives a partition, and
	// another takes over when it goes; bound with weight "1".
	// PoisonQueue is shared by the partitions (each copy names its
	// partition queue in sluice_poison_queue, where a replay sends it).
	// No queue is named Queue. At most 1024. Default 0: one queue.
	Partitions int
	// PartitionKey is the header (message metadata key) whose value the
	// exchange hashes: one value always lands in one partition. Producers
	// set it on every message (PartitionPublisher refuses a message
	// without it). Required with Partitions, refused without.
	PartitionKey string
}

// Topology is the validated set of queues of one consumer queue.
type Topology struct {
	cfg   TopologyConfig
	tiers []broker.Tier
	parts []*Topology // with Partitions: each partition's topology
	// single declares Queue with x-single-active-consumer (a partition).
	single bool
}

// maxTTL keeps x-message-ttl within what RabbitMQ accepts comfortably.
const maxTTL = 24 * 24 * time.Hour

var queueName = regexp.MustCompile(`^[A-Za-z0-9_.:-]+$`)

// maxQueueLength returns the longest consumer queue name, in bytes, whose
// derived names (the tier queues of delays, default the ladder's 30s, 5m,
// 30m, and with defaultPoison the poison queue) all fit in
// broker.NameMaxLength, AMQP's short string.
func maxQueueLength(delays []time.Duration, defaultPoison bool) int {
	if len(delays) == 0 {
		delays = ladderDelays(nil)
	}
	longest := 0
	if defaultPoison {
		longest = len(poisonqueue.Suffix)
	}
	for _, d := range delays {
		longest = max(longest, len(broker.TierTopic("", d)))
	}
	return broker.NameMaxLength - longest
}

func checkQueueName(field, name string) error {
	if err := broker.CheckName("TopologyConfig."+field, name); err != nil {
		return err
	}
	if !queueName.MatchString(name) || strings.HasPrefix(name, "amq.") {
		return fmt.Errorf("rabbitmq: TopologyConfig.%s %q: want [A-Za-z0-9_.:-], not starting with \"amq.\"", field, diag.Bound(name, 64))
	}
	return nil
}

// NewTopology validates cfg. Every name it derives is checked against AMQP's
// 255-byte limit and refused, never cut short.
func NewTopology(cfg TopologyConfig) (*Topology, error) {
	if cfg.Partitions != 0 || cfg.PartitionKey != "" {
		return newPartitioned(cfg)
	}
	if cfg.Queue == "" {
		return nil, errors.New("rabbitmq: TopologyConfig.Queue is required")
	}
	if err := checkQueueName("Queue", cfg.Queue); err != nil {
		return nil, err
	}
	if limit := maxQueueLength(cfg.TierDelays, cfg.PoisonQueue == ""); len(cfg.Queue) > limit {
		return nil, fmt.Errorf("%w: TopologyConfig.Queue is %d bytes; with these tiers it may be at most %d, so that its tier and poison queue names fit",
			broker.ErrNameTooLong, len(cfg.Queue), limit)
	}
	if cfg.PoisonQueue == "" {
		cfg.PoisonQueue = cfg.Queue + poisonqueue.Suffix
	}
	if err := checkQueueName("PoisonQueue", cfg.PoisonQueue); err != nil {
		return nil, err
	}
	if cfg.PoisonQueue == cfg.Queue {
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.PoisonQueue %q: want a queue other than Queue", diag.Bound(cfg.PoisonQueue, 64))
	}
	if err := errors.Join(broker.CheckName("TopologyConfig.Exchange", cfg.Exchange), broker.CheckName("TopologyConfig.BindingKey", cfg.BindingKey)); err != nil {
		return nil, err
	}
	if cfg.DeliveryLimit < 0 || cfg.DeliveryLimit > 0 && !cfg.Quorum {
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.DeliveryLimit %d: want 0, or a positive limit on a quorum queue", cfg.DeliveryLimit)
	}
	if cfg.ExchangeType == "" {
		cfg.ExchangeType = amqp.ExchangeTopic
	}
	if cfg.BindingKey == "" {
		cfg.BindingKey = cfg.Queue
	}
	for i, d := range cfg.TierDelays {
		if d > maxTTL {
			return nil, fmt.Errorf("rabbitmq: TopologyConfig.TierDelays[%d] is %s: want 1ms to %s", i, d, maxTTL)
		}
	}
	tiers, err := broker.Ladder(cfg.Queue, cfg.TierDelays...)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.TierDelays: %w", err)
	}
	if tiers, err = broker.Jittered(cfg.Queue, tiers, cfg.TierJitter); err != nil {
		return nil, fmt.Errorf("rabbitmq: TopologyConfig.TierJitter: %w", err)
	}
	return &Topology{cfg: withTierDefaults(cfg, tiers), tiers: tiers}, nil
}

// withTierDefaults returns cfg with the tier defaults tiers were built
// with: TierDelays the ladder's delays when empty, and TierJitter.Queues
// the waits per tier when jittered.
func withTierDefaults(cfg TopologyConfig, tiers []broker.Tier) TopologyConfig {
	if len(cfg.TierDelays) == 0 {
		cfg.TierDelays = ladderDelays(tiers)
	}
	if cfg.TierJitter.Fraction > 0 && cfg.TierJitter.Queues == 0 && len(tiers) > 0 {
		cfg.TierJitter.Queues = len(tiers[0].Waits)
	}
	return cfg
}

// Config returns the topology's configuration with its defaults filled:
// PoisonQueue, TierDelays, TierJitter.Queues (when jittered),
// ExchangeType and BindingKey; with Partitions, Exchange too. Queue is the
// consumer's queue — with Partitions, the name the partition queues are
// named after (no queue has it: see Partitions) — and Exchange the
// exchange Declare declares ("" when none; with Partitions, the
// consistent-hash exchange producers publish to, hashing the header
// PartitionKey).
func (t *Topology) Config() TopologyConfig {
	cfg := t.cfg
	cfg.TierDelays = slices.Clone(cfg.TierDelays)
	return cfg
}

// Tiers returns the retry tiers in order; each Topic is its queue. Give
// them to retrytiers.Config. Nil with Partitions: each partition has its
// own (Partitions).
func (t *Topology) Tiers() []broker.Tier { return append([]broker.Tier(nil), t.tiers...) }

// queueSpec is one queue and its arguments.
type queueSpec struct {
	name string
	args amqp.Table
}

func (t *Topology) specs() []queueSpec {
	if len(t.parts) > 0 {
		return t.partitionedSpecs()
	}
	typed := func(args amqp.Table) amqp.Table {
		if t.cfg.Quorum {
			args["x-queue-type"] = amqp.QueueTypeQuorum
		}
		return args
	}
	main := amqp.Table{}
	if t.cfg.Quorum {
		main = amqp.Table{
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": t.cfg.PoisonQueue,
			"x-dead-letter-strategy":    "at-least-once",
			"x-overflow":                "reject-publish",
		}
		if t.cfg.DeliveryLimit > 0 {
			main["x-delivery-limit"] = int64(t.cfg.DeliveryLimit)
		}
	}
	if t.single {
		main[amqp.SingleActiveConsumerArg] = true
	}
	specs := []queueSpec{{t.cfg.Queue, typed(main)}}
	for _, w := range t.waits() {
		args := amqp.Table{
			"x-message-ttl":             w.Delay.Milliseconds(),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": t.cfg.Queue,
		}
		if t.cfg.Quorum {
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
		specs = append(specs, queueSpec{w.Topic, typed(args)})
	}
	poisonArgs := amqp.Table{}
	if t.cfg.Quorum {
		poisonArgs["x-delivery-limit"] = int64(poisonqueue.DeliveryLimit)
	}
	return append(specs, queueSpec{t.cfg.PoisonQueue, typed(poisonArgs)})
}

// Plan is what Declare declares, for a reader (`sluice topology plan`
// prints it) or an operator's own tooling. The exchange's name and type
// are Config's Exchange and ExchangeType.
type Plan struct {
	// ExchangeArguments are the arguments the exchange is declared with,
	// as JSON, keys sorted: "{}" when none; with Partitions
	// {"hash-header": PartitionKey}.
	ExchangeArguments string
	// Queues are the queues in the order Declare declares them (all
	// durable), with their arguments and bindings.
	Queues []Declaration
	// Policies are the topology as rabbitmqctl lines, for operators who
	// set queue arguments by policy instead of declaring them: a policy
	// can be changed later, a declared argument cannot. The queue type
	// cannot be set by a policy, so for a quorum topology the queues must
	// still be declared with x-queue-type=quorum (a comment line says so;
	// with Partitions, others say what else a policy does not declare).
	Policies []string
}

// Declaration is one queue of a Plan.
type Declaration struct {
	Name      string
	Arguments string // JSON, keys sorted
	// BindingKey is the key the queue is bound to the exchange with:
	// BindingKey for Queue, or with Partitions each partition queue's
	// weight on the hash ring, "1". "" for a queue not bound: the tier
	// and poison queues, and every queue of a topology without an
	// Exchange.
	BindingKey string
}

// Plan returns what Declare declares.
func (t *Topology) Plan() Plan {
	bound := map[string]string{}
	for _, b := range t.bindings() {
		bound[b.queue] = b.key
	}
	plan := Plan{ExchangeArguments: arguments(t.exchangeArgs()), Policies: t.policies()}
	for _, q := range t.specs() {
		plan.Queues = append(plan.Queues, Declaration{Name: q.name, Arguments: arguments(q.args), BindingKey: bound[q.name]})
	}
	return plan
}

// arguments are args as JSON, keys sorted; "{}" when none.
func arguments(args amqp.Table) string {
	if args == nil {
		args = amqp.Table{}
	}
	b, _ := json.Marshal(args) // map keys are sorted
	return string(b)
}

// ConflictError is a queue or exchange that exists with other arguments
// than the topology declares (RabbitMQ's PRECONDITION_FAILED).
type ConflictError struct {
	Kind, Name string // "queue" or "exchange", and its name
	Argument   string // the argument RabbitMQ named, e.g. "x-message-ttl"
	Detail     string // RabbitMQ's reply text
}

func (e *ConflictError) Error() string {
	head := fmt.Sprintf("rabbitmq: %s %q exists with a different %s than this topology declares (%s); RabbitMQ never changes a declared argument, "+
		"and a policy does not make a declaration with other arguments pass", e.Kind, e.Name, e.Argument, e.Detail)
	if e.Kind == "exchange" {
		return head + ": delete the exchange and let it be declared again (its bindings go with it), or declare the topology on an exchange of another name"
	}
	move := "move the consumer onto a queue of another name declared with this topology, without losing a message " +
		"(sluice topology migrate; docs/rabbitmq.md, \"Moving an existing queue onto Sluice's topology\"), or, if the queue is empty and unused, delete it and let it be declared again"
	if policyArguments[e.Argument] {
		return head + fmt.Sprintf(": %s is one a policy can set and change on an existing queue (as message-ttl, expires, max-length, overflow, dead-letter-exchange, "+
			"dead-letter-routing-key, dead-letter-strategy, delivery-limit: Topology.Plan().Policies), but only where the queue did not declare it; ", e.Argument) + move
	}
	return head + fmt.Sprintf(": %s cannot be set by a policy (neither can x-queue-type, durable, exclusive, auto-delete, x-max-priority): ", e.Argument) + move
}

// policyArguments are the queue arguments a policy can also set (without
// "x-": message-ttl…); the others — x-queue-type, durable, exclusive,
// auto-delete, x-max-priority — only a declaration sets, once.
var policyArguments = map[string]bool{
	"x-message-ttl": true, "x-expires": true, "x-max-length": true, "x-max-length-bytes": true, "x-overflow": true,
	"x-dead-letter-exchange": true, "x-dead-letter-routing-key": true, "x-dead-letter-strategy": true,
	"x-delivery-limit": true, "x-queue-leader-locator": true,
}

var inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)'`)

// Declare declares the exchange and binding (when configured), Queue, the
// tier queues and the poison queue, all durable (Plan lists them). It is
// idempotent; a queue that exists with other arguments gives a
// *ConflictError naming the argument — except a quorum poison queue
// declared without x-delivery-limit (by Sluice before it declared one),
// which is kept as it is. It returns what is left for an operator to do,
// one line each: for such a poison queue, the rabbitmqctl set_policy line
// that gives it poisonqueue.DeliveryLimit (a declared argument cannot
// change; a policy applies to an existing queue at once). It uses a
// channel of its own on conn.
//
// Each of its waits for the broker ends when ctx does, or when 70 s pass
// with no answer but heartbeats (a broker whose channels answer nothing
// while its connection lives; a quorum queue's declaration waits for its
// members, up to RabbitMQ's own 65 s while a leader is elected): conn is
// then closed — every call waiting on it returns, there is no other way
// to end one — and the error says what waited.
func (t *Topology) Declare(ctx context.Context, conn *amqp.Connection) (todo []string, err error) {
	call := func(what string, f func() error) error { return amqpcall.Run(ctx, conn, declareTimeout, what, f) }
	open := func() (*amqp.Channel, error) {
		return amqpcall.Do(ctx, conn, declareTimeout, "rabbitmq: opening a channel", conn.Channel)
	}
	ch, err := open()
	if err != nil {
		return nil, err
	}
	// Closed when Declare ends, whether ctx has or not.
	defer func() {
		_ = amqpcall.Run(context.Background(), conn, declareTimeout, "rabbitmq: closing the declaration's channel", func() error { return ch.Close() })
	}()
	if t.cfg.Exchange != "" {
		if err := call("rabbitmq: declaring exchange "+diag.Printable(t.cfg.Exchange, 255), func() error {
			return ch.ExchangeDeclare(t.cfg.Exchange, t.cfg.ExchangeType, true, false, false, false, t.exchangeArgs())
		}); err != nil {
			return nil, t.exchangeError(err)
		}
	}
	for _, q := range t.specs() {
		if err := ctx.Err(); err != nil {
			return todo, err
		}
		err := call("rabbitmq: declaring queue "+diag.Printable(q.name, 255), func() error {
			_, err := ch.QueueDeclare(q.name, true, false, false, false, q.args)
			return err
		})
		if err == nil {
			continue
		}
		var ce *ConflictError
		if err = conflict("queue", q.name, err); errors.As(err, &ce) && q.name == t.cfg.PoisonQueue && t.cfg.Quorum && ce.Argument == "x-delivery-limit" {
			// The conflict closed the channel: go on with a new one.
			if ch, err = open(); err != nil {
				return todo, err
			}
			if err = call("rabbitmq: declaring queue "+diag.Printable(q.name, 255), func() error {
				_, err := ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
				return err
			}); err != nil {
				return todo, err
			}
			todo = append(todo, t.poisonPolicy())
		}
		if err != nil {
			if ce != nil && t.cfg.Quorum && ce.Argument != "x-queue-type" && t.isClassic(ctx, conn, q.name) {
				ce.Detail = fmt.Sprintf("%s is a classic queue: it passes a classic declaration; RabbitMQ named %s: %s", q.name, ce.Argument, ce.Detail)
				ce.Argument = "x-queue-type"
			}
			return todo, err
		}
	}
	for _, b := range t.bindings() {
		if err := call(fmt.Sprintf("rabbitmq: binding %q to %q", b.queue, t.cfg.Exchange), func() error {
			return ch.QueueBind(b.queue, b.key, t.cfg.Exchange, false, nil)
		}); err != nil {
			return todo, fmt.Errorf("rabbitmq: binding %q to %q: %w", b.queue, t.cfg.Exchange, err)
		}
	}
	return todo, nil
}

// declareTimeout bounds each of Topology.Declare's waits for the broker's
// answer: above RabbitMQ's own longest wait on a quorum queue's Raft
// command (net_ticktime + 5 s, 65 s by default, while a leader is elected).
const declareTimeout = 70 * time.Second

// isClassic reports whether queue, which conflicts with this quorum
// topology, passes the declaration of the same topology with classic
// queues: then its type is what differs, although RabbitMQ names the first
// argument it compares (x-dead-letter-exchange). Redeclaring a queue with
// its own arguments changes nothing.
func (t *Topology) isClassic(ctx context.Context, conn *amqp.Connection, queue string) bool {
	cfg := t.cfg
	cfg.Quorum, cfg.DeliveryLimit = false, 0
	classic, err := NewTopology(cfg)
	if err != nil {
		return false
	}
	classic.single = t.single
	for _, q := range classic.specs() {
		if q.name == queue {
			// A channel of its own, which a refusal closes; conn closed
			// under it if the broker does not answer (Declare's bound).
			err := amqpcall.Run(ctx, conn, declareTimeout, "rabbitmq: declaring queue "+diag.Printable(queue, 255)+" as a classic queue", func() error {
				ch, err := conn.Channel()
				if err != nil {
					return err
				}
				defer func() { _ = ch.Close() }()
				_, err = ch.QueueDeclare(q.name, true, false, false, false, q.args)
				return err
			})
			return err == nil
		}
	}
	return false
}

// poisonPolicy is the policy line that gives an existing quorum poison
// queue its delivery limit.
func (t *Topology) poisonPolicy() string {
	return fmt.Sprintf("%s exists without x-delivery-limit (declared before Sluice declared one): reading it may reorder it, and on RabbitMQ 4.x "+
		"its default limit of 20 may drop messages; unless a policy gives it a limit already, give it this one: %s",
		t.cfg.PoisonQueue, policyLine(t.cfg.PoisonQueue, map[string]any{"delivery-limit": poisonqueue.DeliveryLimit}))
}

func conflict(kind, name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		arg := "argument"
		if m := inequivalentArg.FindStringSubmatch(ae.Reason); m != nil {
			arg = m[1]
		}
		return &ConflictError{Kind: kind, Name: name, Argument: arg, Detail: ae.Reason}
	}
	return fmt.Errorf("rabbitmq: declaring %s %q: %w", kind, name, err)
}

// policies are Plan's Policies.
func (t *Topology) policies() []string {
	var lines []string
	queues := t.cfg.Queue + ", its tiers"
	if n := len(t.parts); n > 0 {
		lines = append(lines, fmt.Sprintf("# declare the exchange %s of type %s with %s, and bind %s to it with weight %s: a policy declares neither",
			t.cfg.Exchange, exchangeConsistentHash, arguments(t.exchangeArgs()), partitionRange(t.cfg.Queue, n), partitionWeight),
			fmt.Sprintf("# declare %s with x-single-active-consumer=true: a policy cannot set it", partitionRange(t.cfg.Queue, n)))
		queues = partitionRange(t.cfg.Queue, n) + ", their tiers"
	}
	if t.cfg.Quorum {
		lines = append(lines, fmt.Sprintf("# declare %s and %s with x-queue-type=quorum: a policy cannot set the queue type", queues, t.cfg.PoisonQueue))
	}
	for _, q := range t.specs() {
		def := map[string]any{}
		for k, v := range q.args {
			if k != "x-queue-type" && k != amqp.SingleActiveConsumerArg {
				def[strings.TrimPrefix(k, "x-")] = v
			}
		}
		if len(def) == 0 {
			continue
		}
		lines = append(lines, policyLine(q.name, def))
	}
	return lines
}

// policyLine is the rabbitmqctl set_policy line that gives queue def.
func policyLine(queue string, def map[string]any) string {
	b, _ := json.Marshal(def) // map keys are sorted
	return fmt.Sprintf("rabbitmqctl set_policy --apply-to queues --priority 10 %s '^%s$' '%s'",
		"sluice-"+strings.NewReplacer(".", "-", ":", "-").Replace(queue), regexp.QuoteMeta(queue), b)
}

// ladderDelays are the delays of tiers; of the default ladder when tiers is
// empty.
func ladderDelays(tiers []broker.Tier) []time.Duration {
	if len(tiers) == 0 {
		tiers, _ = broker.Ladder("q") // the default ladder: valid
	}
	delays := make([]time.Duration, len(tiers))
	for i, t := range tiers {
		delays[i] = t.Delay
	}
	return delays
}
