package rabbitmq

import (
	"strings"

	"github.com/sluicemq/sluice"
)

// Metadata keys the Marshaler sets from each delivery. They describe one
// delivery, not the message: Unmarshal computes them afresh and Marshal never
// publishes them, so a republished copy carries no stale values and RabbitMQ's
// own x- headers are never republished as strings.
const (
	// DeliveryPrefix starts every delivery-scoped key.
	DeliveryPrefix = "sluice_amqp_"

	// ExchangeKey is the exchange the message was published to ("" for the
	// default exchange).
	ExchangeKey = sluice.SourceExchangeKey
	// RoutingKeyKey is the routing key the message was published with.
	RoutingKeyKey = sluice.SourceRoutingKeyKey
	// RedeliveredKey is "true" when the broker delivered the message before.
	RedeliveredKey = DeliveryPrefix + "redelivered"
	// DeliveryCountKey is x-delivery-count (quorum queues): earlier
	// deliveries that were not acked.
	DeliveryCountKey = DeliveryPrefix + "delivery_count"
	// DeathCountKey sums the counts of the x-death entries: how often the
	// message was dead-lettered (a TTL tier expiring counts once per pass).
	DeathCountKey = DeliveryPrefix + "death_count"
	// FirstDeathQueueKey, FirstDeathReasonKey and FirstDeathExchangeKey are
	// x-first-death-queue, -reason and -exchange.
	FirstDeathQueueKey    = DeliveryPrefix + "first_death_queue"
	FirstDeathReasonKey   = DeliveryPrefix + "first_death_reason"
	FirstDeathExchangeKey = DeliveryPrefix + "first_death_exchange"
	// LastDeathQueueKey and LastDeathReasonKey are the queue and reason of
	// the most recent x-death entry.
	// They are sluice.DeadLetterQueueKey and DeadLetterReasonKey: the
	// stages' keyless proof that a copy came back from its own tier.
	LastDeathQueueKey  = sluice.DeadLetterQueueKey
	LastDeathReasonKey = sluice.DeadLetterReasonKey
)

func isDeliveryScoped(key string) bool { return strings.HasPrefix(key, DeliveryPrefix) }

// Metadata keys of a message's AMQP properties. Unlike the delivery-scoped
// keys they belong to the message: the Marshaler sets them from each
// delivery's properties (a foreign producer's content type, correlation id,
// ...), and only from them — a header of such a name is dropped — so the
// handler can read them, and Marshal restores them as properties
// — not headers — on every copy Sluice publishes (retry tiers, poison queue)
// and on replays. Expiration is never carried: the retry tiers own TTL.
const (
	// PropertyPrefix starts every property key.
	PropertyPrefix = "sluice_property_"

	ContentTypeKey     = PropertyPrefix + "content_type"
	ContentEncodingKey = PropertyPrefix + "content_encoding"
	CorrelationIDKey   = PropertyPrefix + "correlation_id"
	MessageIDKey       = PropertyPrefix + "message_id"
	TypeKey            = PropertyPrefix + "type"
	AppIDKey           = PropertyPrefix + "app_id"
	ReplyToKey         = PropertyPrefix + "reply_to"
	// TimestampKey is the timestamp property in RFC 3339 (UTC, seconds).
	TimestampKey = PropertyPrefix + "timestamp"
	// PriorityKey is the priority property, 0-255 in decimal.
	PriorityKey = PropertyPrefix + "priority"
	// UserIDKey is the user_id property the broker validated for the
	// publisher of this delivery. It is never restored as the property:
	// RabbitMQ refuses a publish whose user_id is not the publishing
	// connection's user. A copy carries it as OriginUserIDKey instead.
	UserIDKey = PropertyPrefix + "user_id"
)

// OriginUserIDKey is the user_id the broker validated for the message's
// first publisher. Unmarshal sets it from a delivery's user_id property; a
// delivery without one (a copy Sluice published: RabbitMQ refuses a foreign
// user_id) keeps the header, a control header the stages believe only on a
// copy Sluice wrote (sluice.IsControlKey).
const OriginUserIDKey = sluice.OriginPrefix + "user_id"
