package deduplication_test

import (
	"testing"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
)

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(*testing.T) deduplication.Store { return deduplication.NewMemoryStore() })
}
