package dlq_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/dlq"
)

// A poison queue's family, by the topology's names: its main queue and
// its partition queues as rabbitmq.PartitionQueue names them, nothing else.
func TestFamilyIsTheTopologysNames(t *testing.T) {
	for queue, want := range map[string]bool{
		"orders": true, "orders.p0": true, "orders.p7": true, "orders.p12": true,
		"orders.p01": false, "orders.p": false, "orders.p-1": false, "orders.p+1": false, "orders.px": false,
		"orders.p1x": false, "billing": false, "orders.poison": false, "orders.retry.1s": false,
	} {
		require.Equal(t, want, dlq.InFamily("orders.poison", queue), queue)
	}
	require.False(t, dlq.InFamily("orders-dead", "orders"), "a poison queue named otherwise has no family by name")
	require.False(t, dlq.InFamily(".poison", ""))
}
