package embedded_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/broker/brokertest"
	"github.com/sluicemq/sluice/embedded"
)

// The embedded default passes the broker conformance suite.
func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, func(t *testing.T) brokertest.Broker {
		b, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() }) // what a subtest left unacked is reported, not a failure here
		return brokertest.Broker{Broker: b, Input: b.PubSub().Publisher()}
	})
}
