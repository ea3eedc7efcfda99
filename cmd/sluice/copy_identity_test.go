package main

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
)

// One delivery poisoned twice (its first copy's confirm lost, the
// redelivery isolated again) is two messages and one item in `dlq stats`:
// both copies carry one identity.
func TestStatsCountsCopiesOfOneDeliveryOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	bad := sluice.Poison(errors.New(`missing field "sku"`))
	b.poisoned(t, "e1", "order.created", bad)
	b.poisoned(t, "e1", "order.created", bad) // the redelivery's copy
	b.poisoned(t, "e2", "order.created", bad)

	code, out, errOut := b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "3 messages (2 items: copies with one identity count once)")
	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--json")
	require.Equal(t, 0, code, errOut)
	var s dlq.Stats
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Equal(t, 3, s.Total)
	require.Equal(t, 2, s.Items)
}
