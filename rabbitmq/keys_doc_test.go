package rabbitmq_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// docKey matches what docs/rabbitmq.md writes in backquotes for a key of the
// delivery, of a property or of the origin.
var docKey = regexp.MustCompile("`(sluice_(?:amqp|property|origin)_[a-z_]+)`")

// rabbitmqKeys returns the delivery, property and origin keys
// internal/metakeys defines (by value, with their constant's name), those
// the rows of docs/rabbitmq.md's tables name, and those the page names
// anywhere.
func rabbitmqKeys(t *testing.T) (defined map[string]string, tabled, named map[string]bool) {
	t.Helper()
	defined = map[string]string{}
	for name, v := range testenv.StringConstants(t, "../internal/metakeys") {
		for _, prefix := range []string{metakeys.DeliveryPrefix, metakeys.PropertyPrefix, metakeys.OriginPrefix} {
			if strings.HasPrefix(v, prefix) && v != prefix {
				defined[v] = name
			}
		}
	}
	doc, err := os.ReadFile("../docs/rabbitmq.md")
	require.NoError(t, err)
	tabled, named = map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		for _, m := range docKey.FindAllStringSubmatch(line, -1) {
			named[m[1]] = true
			if strings.HasPrefix(line, "|") {
				tabled[m[1]] = true
			}
		}
	}
	return defined, tabled, named
}

// The keys the Marshaler sets (sluice_amqp_*, sluice_property_*) and the
// origin keys (sluice_origin_*) are not exported: users read them in the
// tables of docs/rabbitmq.md, which must list every one internal/metakeys
// defines; and the page names no such key that the code does not define.
func TestTheDocsTablesListEveryDeliveryPropertyAndOriginKey(t *testing.T) {
	t.Parallel()
	defined, tabled, named := rabbitmqKeys(t)
	require.GreaterOrEqual(t, len(defined), 24, "the delivery, property and origin keys")
	var keys []string
	for v := range defined {
		keys = append(keys, v)
	}
	slices.Sort(keys)
	for _, v := range keys {
		require.True(t, tabled[v], "docs/rabbitmq.md's tables do not list %q (metakeys.%s)", v, defined[v])
	}
	for v := range named {
		_, ok := defined[v]
		require.True(t, ok, "docs/rabbitmq.md names %q, which internal/metakeys does not define", v)
	}
}

// What Unmarshal sets from a delivery that carries every property and every
// header RabbitMQ adds is what the tables list: each key it sets is in
// them, and each delivery and property key of the tables is set (but
// sluice_amqp_headers_error, set only when the frame filter replaced the
// headers, and the origin keys the copies record: the stage tests check
// those).
func TestUnmarshalSetsTheDocumentedKeys(t *testing.T) {
	t.Parallel()
	_, tabled, _ := rabbitmqKeys(t)
	m, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: nopAcker{},
		Exchange: "orders-x", RoutingKey: "orders", Redelivered: true,
		ContentType: "application/json", ContentEncoding: "gzip", CorrelationId: "c-1", MessageId: "m-1",
		Type: "order.created", AppId: "shop", ReplyTo: "replies", UserId: "alice",
		Timestamp: time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC), Priority: 5,
		Headers: amqp.Table{
			"x-delivery-count":       int64(2),
			"x-first-death-queue":    "orders",
			"x-first-death-reason":   "rejected",
			"x-first-death-exchange": "orders-x",
			"x-death": []any{
				amqp.Table{"count": int64(1), "queue": "orders.retry.1s", "reason": "expired"},
				amqp.Table{"count": int64(1), "queue": "orders", "reason": "rejected"},
			},
		},
	})
	require.NoError(t, err)
	for k := range m.Metadata {
		if docKey.MatchString("`" + k + "`") {
			require.True(t, tabled[k], "Unmarshal sets %s, which docs/rabbitmq.md's tables do not list", k)
		}
	}
	for k := range tabled {
		switch {
		case k == metakeys.HeadersError, k == metakeys.OriginExchange, k == metakeys.OriginRoutingKey:
		default:
			_, ok := m.Metadata[k]
			require.True(t, ok, "docs/rabbitmq.md's tables list %s; Unmarshal did not set it (it set %v)", k, m.Metadata)
		}
	}
	require.Equal(t, "2", m.Metadata.Get(metakeys.DeathCount))
	require.Equal(t, "orders.retry.1s", m.Metadata.Get(metakeys.DeadLetterQueue), "the most recent death, first in x-death")
	require.Equal(t, "alice", m.Metadata.Get(metakeys.OriginUserID))
}
