package rabbitmq_test

import (
	"crypto/tls"
	"testing"

	"github.com/stretchr/testify/require"

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
	_, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{Connection: rabbitmq.Connection{URLs: []string{ok, "amqp://guest:s3cret@127.0.0.1:5673/"}}})
	require.ErrorContains(t, err, "SubscriberConfig.URLs has 2 nodes: watermill-amqp's subscriber connects to one")
}
