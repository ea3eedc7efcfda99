package rabbitmq_test

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Connection.URLs is checked node by node: each error names the field and
// its index, never a password; URL and URLs together are refused.
func TestConnectionURLsAreValidated(t *testing.T) {
	t.Parallel()
	const ok = "amqp://guest:s3cret@127.0.0.1:5672/"
	for _, tc := range []struct {
		name string
		conn rabbitmq.Connection
		want string
	}{
		{"both", rabbitmq.Connection{URL: ok, URLs: []string{ok}}, "PublisherConfig.URL and PublisherConfig.URLs are both set: set URL for one node, URLs for a cluster's nodes"},
		{"empty node", rabbitmq.Connection{URLs: []string{ok, ""}}, "PublisherConfig.URLs[1] is empty"},
		{"not AMQP", rabbitmq.Connection{URLs: []string{ok, "http://guest:s3cret@host/"}}, "PublisherConfig.URLs[1] http://guest:xxxxx@host/ is not an AMQP URI: AMQP scheme must be either 'amqp://' or 'amqps://'"},
		{"twice", rabbitmq.Connection{URLs: []string{ok, ok}}, "PublisherConfig.URLs[1] amqp://guest:xxxxx@127.0.0.1:5672/ is listed twice"},
		{"TLS on amqp://", rabbitmq.Connection{URLs: []string{"amqps://guest:s3cret@a/", ok}, TLS: &tls.Config{MinVersion: tls.VersionTLS12}}, "PublisherConfig.TLS needs an amqps:// URL, PublisherConfig.URLs[1] is amqp://guest:xxxxx@127.0.0.1:5672/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: tc.conn})
			require.EqualError(t, err, "rabbitmq: "+tc.want)
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
	_, err := rabbitmq.NewWatermillSubscriber(rabbitmq.Connection{URLs: []string{ok, "amqp://guest:s3cret@127.0.0.1:5673/"}})
	require.ErrorContains(t, err, "BrokerConfig.URLs has 2 nodes: watermill-amqp's subscriber (WatermillSubscriber) connects to one")
}

// Issue 45: a Broker on watermill-amqp's subscriber (WatermillSubscriber),
// which connects to one node, is refused with several URLs before anything
// is declared, and the refusal names the BrokerConfig the caller wrote.
// Before, NewBroker declared the queue, its tiers and its poison queue, then
// failed naming SubscriberConfig.URLs, a config the caller never saw — and
// panicked closing the nil subscriber it had kept (a typed nil).
func TestAWatermillSubscriberBrokerOnSeveralNodesIsRefusedBeforeDeclaring(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("wm_nodes")
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison")
	_, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection:          rabbitmq.Connection{URLs: []string{testenv.AMQPURL, "amqp://guest:s3cret@127.0.0.1:5673/"}},
		Topology:            rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{time.Second}},
		WatermillSubscriber: true, DepthInterval: -1,
	})
	require.ErrorContains(t, err, "BrokerConfig.URLs has 2 nodes: watermill-amqp's subscriber (WatermillSubscriber) connects to one")
	require.NotContains(t, err.Error(), "s3cret")
	_, err = testenv.Channel(t, testenv.AMQP(t)).QueueDeclarePassive(queue, true, false, false, false, nil)
	require.Error(t, err, "nothing declared")
}
