package outbox_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/sluicesql"
)

// A RelayConfig that cannot work is refused by NewRelay, with the field
// named.
func TestNewRelayRefusesABadConfig(t *testing.T) {
	t.Parallel()
	store, err := sluicesql.NewOutbox(testenv.SQLite(t), sluicesql.OutboxConfig{Table: "outbox"})
	require.NoError(t, err)
	pub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	t.Cleanup(func() { _ = pub.Close() })
	for _, c := range []struct {
		store outbox.Store
		pub   message.Publisher
		cfg   outbox.RelayConfig
		want  string
	}{
		{nil, pub, outbox.RelayConfig{}, "NewRelay: the Store is required"},
		{store, nil, outbox.RelayConfig{}, "NewRelay: the Publisher is required"},
		{store, pub, outbox.RelayConfig{BatchSize: -1}, "BatchSize must be between 1 and 10000, got -1"},
		{store, pub, outbox.RelayConfig{BatchSize: 10001}, "BatchSize must be between 1 and 10000, got 10001"},
		{store, pub, outbox.RelayConfig{Concurrency: -1}, "Concurrency must be between 1 and 64, got -1"},
		{store, pub, outbox.RelayConfig{Concurrency: 65}, "Concurrency must be between 1 and 64, got 65"},
		{store, pub, outbox.RelayConfig{PollInterval: -1}, "PollInterval must not be negative"},
		{store, pub, outbox.RelayConfig{RetryMin: 2 * 60e9, RetryMax: 60e9}, "RetryMax (1m0s) must not be shorter than RetryMin (2m0s)"},
	} {
		_, err := outbox.NewRelay(c.store, c.pub, c.cfg)
		require.ErrorContains(t, err, c.want)
	}
	_, err = outbox.NewRelay(store, pub, outbox.RelayConfig{Concurrency: 64})
	require.NoError(t, err)
}
