package rabbitmq

import (
	"strings"

	"github.com/sluicemq/sluice/internal/metakeys"
)

// Metadata keys the Marshaler sets from each delivery. They describe one
// delivery, not the message: Unmarshal computes them afresh and Marshal never
// publishes them, so a republished copy carries no stale values and RabbitMQ's
// own x- headers are never republished as strings.
const (
	// deliveryPrefix starts every delivery-scoped key.
	deliveryPrefix = "sluice_amqp_"

	// ExchangeKey is the exchange the delivery was published to ("" for
	// the default exchange): after a retry tier, the dead-letter hop's, not
	// the producer's (OriginExchangeKey).
	ExchangeKey = metakeys.SourceExchange
	// RoutingKeyKey is the routing key the delivery was published with.
	RoutingKeyKey = metakeys.SourceRoutingKey
	// RedeliveredKey is "true" when the broker delivered the message before.
	RedeliveredKey = deliveryPrefix + "redelivered"
	// DeliveryCountKey is x-delivery-count (quorum queues): earlier
	// deliveries that were not acked.
	DeliveryCountKey = deliveryPrefix + "delivery_count"
	// DeathCountKey sums the counts of the x-death entries: how often the
	// message was dead-lettered (a TTL tier expiring counts once per pass).
	DeathCountKey = deliveryPrefix + "death_count"
	// FirstDeathQueueKey, FirstDeathReasonKey and FirstDeathExchangeKey are
	// x-first-death-queue, -reason and -exchange.
	FirstDeathQueueKey    = deliveryPrefix + "first_death_queue"
	FirstDeathReasonKey   = deliveryPrefix + "first_death_reason"
	FirstDeathExchangeKey = deliveryPrefix + "first_death_exchange"
	// LastDeathQueueKey and LastDeathReasonKey are the queue and reason of
	// the most recent x-death entry ("expired" for a tier's TTL): the
	// stages' keyless proof that a copy came back from its own tier. The
	// Marshaler drops a header of these names a producer sends; the
	// embedded broker's tiers set them as well, on each copy they deliver.
	LastDeathQueueKey  = metakeys.DeadLetterQueue
	LastDeathReasonKey = metakeys.DeadLetterReason
)

func isDeliveryScoped(key string) bool { return strings.HasPrefix(key, deliveryPrefix) }

// Metadata keys of a message's AMQP properties. Unlike the delivery-scoped
// keys they belong to the message: the Marshaler sets them from each
// delivery's properties (a foreign producer's content type, correlation id,
// ...), and only from them — a header of such a name is dropped — so the
// handler can read them, and Marshal restores them as properties
// — not headers — on every copy Sluice publishes (retry tiers, poison queue)
// and on replays. Expiration is never carried: the retry tiers own TTL.
const (
	// propertyPrefix starts every property key.
	propertyPrefix = "sluice_property_"

	ContentTypeKey     = propertyPrefix + "content_type"
	ContentEncodingKey = propertyPrefix + "content_encoding"
	CorrelationIDKey   = propertyPrefix + "correlation_id"
	MessageIDKey       = propertyPrefix + "message_id"
	TypeKey            = propertyPrefix + "type"
	AppIDKey           = propertyPrefix + "app_id"
	ReplyToKey         = propertyPrefix + "reply_to"
	// TimestampKey is the timestamp property in RFC 3339 (UTC, seconds).
	TimestampKey = propertyPrefix + "timestamp"
	// PriorityKey is the priority property, 0-255 in decimal.
	PriorityKey = propertyPrefix + "priority"
	// UserIDKey is the user_id property the broker validated for the
	// publisher of this delivery. It is never restored as the property:
	// RabbitMQ refuses a publish whose user_id is not the publishing
	// connection's user. A copy carries it as OriginUserIDKey instead.
	UserIDKey = propertyPrefix + "user_id"
)

// OriginUserIDKey is the user_id the broker validated for the message's
// first publisher. Unmarshal sets it from a delivery's user_id property; a
// delivery without one (a copy Sluice published: RabbitMQ refuses a foreign
// user_id) keeps the header, a control header the stages believe only on a
// copy Sluice wrote (sluice.IsControlKey).
const OriginUserIDKey = metakeys.OriginPrefix + "user_id"

// OriginExchangeKey and OriginRoutingKeyKey are where the message was first
// published to, recorded once by the retry-tier stage at the first failure
// (from ExchangeKey and RoutingKeyKey) and kept on every later copy: after a
// retry tier the delivery's own exchange and routing key name the
// dead-letter hop, not the producer's. The poison diagnosis reports these
// when present. Control headers (sluice.IsControlKey), like OriginUserIDKey.
const (
	OriginExchangeKey   = metakeys.OriginExchange
	OriginRoutingKeyKey = metakeys.OriginRoutingKey
)

// Origin returns where the message of metadata md was first published to:
// OriginExchangeKey and OriginRoutingKeyKey when a retry copy recorded them,
// else the delivery's own ExchangeKey and RoutingKeyKey. ok is false when
// neither is known.
func Origin(md map[string]string) (exchange, routingKey string, ok bool) {
	return metakeys.Origin(md)
}
