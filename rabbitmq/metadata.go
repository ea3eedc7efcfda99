package rabbitmq

import (
	"strings"

	"github.com/sluicemq/sluice/internal/metakeys"
)

// The Marshaler sets metadata keys from each delivery, which the tables of
// docs/rabbitmq.md list (internal/metakeys holds them):
//
//   - the delivery-scoped keys, sluice_amqp_*: the exchange and routing key
//     the delivery was published with ("sluice_amqp_exchange",
//     "sluice_amqp_routing_key": after a retry tier, the dead-letter hop's),
//     "sluice_amqp_redelivered", what RabbitMQ's x-death, x-first-death-*
//     and x-delivery-count headers say ("sluice_amqp_death_count",
//     "sluice_amqp_last_death_queue", "sluice_amqp_last_death_reason", ...)
//     and "sluice_amqp_headers_error". They describe one delivery, not the
//     message: Unmarshal computes them afresh and Marshal never publishes
//     them, so a republished copy carries no stale values and RabbitMQ's own
//     x- headers are never republished as strings;
//   - the property keys, sluice_property_* ("sluice_property_content_type",
//     ...): they belong to the message. Only the delivery's properties set
//     them — a header of such a name is dropped — and Marshal restores them
//     as properties, not headers, on every copy Sluice publishes (retry
//     tiers, poison queue) and on replays. Expiration is never carried: the
//     retry tiers own TTL;
//   - "sluice_origin_user_id": the user_id the broker validated for the
//     message's first publisher, from a delivery's user_id property, which
//     a copy carries as this header (RabbitMQ refuses a foreign user_id).
//     Like the retry stage's "sluice_origin_exchange" and
//     "sluice_origin_routing_key" (Origin), a control header the stages
//     believe only on a copy Sluice wrote (sluice.IsControlKey).

func isDeliveryScoped(key string) bool { return strings.HasPrefix(key, metakeys.DeliveryPrefix) }

// Origin returns where the message of metadata md was first published to:
// the retry stage's "sluice_origin_exchange" and
// "sluice_origin_routing_key" when a retry copy recorded them, else the
// delivery's own "sluice_amqp_exchange" and "sluice_amqp_routing_key". ok is
// false when neither is known.
func Origin(md map[string]string) (exchange, routingKey string, ok bool) {
	return metakeys.Origin(md)
}
