package redisstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/deduplication/redisstore"
	"github.com/sluicemq/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		client, prefix := testenv.Redis(t)
		s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix})
		require.NoError(t, err)
		return s
	})
}
