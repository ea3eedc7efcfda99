package rabbitmq

import (
	"strings"

	"github.com/sluicemq/sluice/middleware"
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
	ExchangeKey = middleware.SourceExchangeKey
	// RoutingKeyKey is the routing key the message was published with.
	RoutingKeyKey = middleware.SourceRoutingKeyKey
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
	LastDeathQueueKey  = DeliveryPrefix + "last_death_queue"
	LastDeathReasonKey = DeliveryPrefix + "last_death_reason"
)

func isDeliveryScoped(key string) bool { return strings.HasPrefix(key, DeliveryPrefix) }
