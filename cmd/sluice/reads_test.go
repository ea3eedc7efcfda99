package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
)

// Reading a quorum poison queue is no retry: each read counts one delivery
// in the broker's x-delivery-count, which the CLI and the console show as
// reads, labelled, beside the attempts Sluice recorded (4: the handler's).
// Before, inspect showed no count at all while its JSON and the console's
// header table showed sluice_amqp_delivery_count 3 and
// sluice_amqp_redelivered true bare — read as 3 retries.
func TestPoisonQueueReadsAreNotRetries(t *testing.T) {
	t.Parallel()
	b := newQuorumBed(t, 0)
	b.poisoned(t, "e1", "order.created", sluice.Poison(errors.New("bad"))) // its attempt: 4
	poisonQ := b.topo.Config().PoisonQueue
	for range 3 {
		code, _, errOut := b.cli(t, "dlq", "inspect", "--queue", poisonQ)
		require.Equal(t, 0, code, errOut)
	}
	code, out, errOut := b.cli(t, "dlq", "inspect", "--queue", poisonQ)
	require.Equal(t, 0, code, errOut)
	flat := strings.Join(strings.Fields(strings.NewReplacer("│", " ").Replace(out)), " ")
	require.Contains(t, flat, "attempts 4")
	require.Contains(t, flat, "poison-queue reads 3: reads of this copy in the poison queue")
	require.Contains(t, flat, "not retries")

	code, out, errOut = b.cli(t, "dlq", "inspect", "--queue", poisonQ, "--json")
	require.Equal(t, 0, code, errOut)
	var rec struct {
		Attempts string `json:"attempts"`
		Reads    int    `json:"reads"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &rec))
	require.Equal(t, "4", rec.Attempts)
	require.Equal(t, 4, rec.Reads, "the fifth read")

	base, _ := consoleOn(t, b, "", nil)
	ctx := browser(t)
	do(t, ctx, chromedp.Navigate(base+"/q/"+poisonQ+"/g/"+groupOf(t, poisonQ, "e1")), chromedp.WaitVisible("#messages"))
	do(t, ctx, chromedp.Click("details.message summary"), chromedp.WaitVisible("td.reads"))
	require.Contains(t, textOf(t, ctx, "td.attempts"), "4 (deliveries the handler failed")
	require.Contains(t, textOf(t, ctx, "td.reads"), readsLabel)
	headers := textOf(t, ctx, "table.headers")
	require.Contains(t, headers, "sluice_amqp_delivery_count")
	require.Contains(t, headers, "not retries")
	require.Contains(t, headers, "read before from the poison queue, by a console page or a sluice dlq command: not a retry")
}
