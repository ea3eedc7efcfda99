// Package metakeys holds the metadata keys Sluice's packages share that are
// not the root's vocabulary: the AMQP delivery's keys the brokers set and
// the stages read (public as rabbitmq.ExchangeKey, RoutingKeyKey,
// LastDeathQueueKey, LastDeathReasonKey, OriginExchangeKey,
// OriginRoutingKeyKey and rabbitmq.Origin), and the prefixes of the poison
// and replay stages' control keys (sluice.IsControlKey).
package metakeys

const (
	// SourceExchange and SourceRoutingKey are where the delivery was
	// published to; set for each delivery by the rabbitmq Marshaler, and
	// never republished by it.
	SourceExchange   = "sluice_amqp_exchange"
	SourceRoutingKey = "sluice_amqp_routing_key"

	// DeadLetterQueue and DeadLetterReason are the queue a delivery was last
	// dead-lettered from and why (DeadLetterExpired for a tier's TTL): set
	// for each delivery by the broker (the rabbitmq Marshaler from x-death;
	// the embedded tiers when they deliver a copy), never republished.
	DeadLetterQueue  = "sluice_amqp_last_death_queue"
	DeadLetterReason = "sluice_amqp_last_death_reason"
	// DeadLetterExpired is DeadLetterReason for a tier's TTL.
	DeadLetterExpired = "expired"

	// OriginPrefix starts every key that records where a message came from:
	// facts about its first publish, kept on every copy.
	OriginPrefix = "sluice_origin_"
	// OriginExchange and OriginRoutingKey are where the message was first
	// published to, recorded once by the retry-tier stage at the first
	// failure (from SourceExchange and SourceRoutingKey) and kept on every
	// later copy.
	OriginExchange   = OriginPrefix + "exchange"
	OriginRoutingKey = OriginPrefix + "routing_key"

	// PoisonPrefix and ReplayPrefix start the poison stage's and the replay
	// stage's control keys.
	PoisonPrefix = "sluice_poison" // sluice_poison_*, sluice_poisoned_at
	ReplayPrefix = "sluice_replay" // sluice_replay_run, _item, _count, sluice_replayed_*
)

// Origin returns where a message was first published to: OriginExchange and
// OriginRoutingKey when a retry copy recorded them, else the delivery's own
// SourceExchange and SourceRoutingKey. ok is false when neither is known.
func Origin(md map[string]string) (exchange, routingKey string, ok bool) {
	if rk, found := md[OriginRoutingKey]; found {
		return md[OriginExchange], rk, true
	}
	if rk, found := md[SourceRoutingKey]; found {
		return md[SourceExchange], rk, true
	}
	return "", "", false
}
