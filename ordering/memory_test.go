package ordering_test

import (
	"testing"

	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/ordering/orderingtest"
)

func TestMemoryStoreConforms(t *testing.T) {
	t.Parallel()
	orderingtest.Run(t, ordering.NewMemoryStore(), "ledger")
}
