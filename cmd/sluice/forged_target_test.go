package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/signing"
)

// forgedInto publishes straight to the bed's poison queue a message whose
// own headers name another service's queue, as anyone allowed to publish
// there (or a dead-letter route) can; it returns that queue, declared.
func forgedInto(t *testing.T, b *bed, id string) string {
	t.Helper()
	billing := testenv.Name("billing")
	ch := testenv.Channel(t, testenv.AMQP(t))
	_, err := ch.QueueDeclare(billing, true, false, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, billing)
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", b.topo.Config().PoisonQueue, true, false, amqp.Publishing{Headers: amqp.Table{
		metakeys.PoisonClass: "poison", metakeys.PoisonReason: "x", metakeys.PoisonQueue: billing, sluice.EventIDKey: id,
	}, Body: []byte(`{}`)}))
	return billing
}

// Issue 43, item 1: a message's own target meets the rule `to` meets. The
// console replayed a message into a queue outside its configuration when
// the message's sluice_poison_queue named it (the dry run listed it, the
// replay put it there), while `to=billing` was refused; with a Signer the
// replay was refused but the dry run still offered billing. Now the dry
// run shows it refused, with and without a Signer, and the replay stops on
// it, the message kept in the poison queue.
func TestConsoleRefusesAMessagesOwnTargetOutsideItsQueues(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	billing := forgedInto(t, b, "e1")
	rc := newRecovering(t, b, func(string) bool { return false })
	pq := b.topo.Config().PoisonQueue
	g := groupOf(t, pq, "e1")
	ctx := browser(t)

	key := filepath.Join(t.TempDir(), "sluice.key")
	require.NoError(t, os.WriteFile(key, []byte("7d1f0c3b9a8e4f2d6c5b4a39281706f5e4d3c2b1a0998877\n"), 0o600))
	signer, err := signing.NewFromFile(key)
	require.NoError(t, err)
	signed, _ := consoleOn(t, b, rc.outcomesTable, func(c *console.Config) { c.Signer = signer })
	do(t, ctx, chromedp.Navigate(signed+"/q/"+pq+"/g/"+g+"/replay"), chromedp.WaitVisible(chromedp.CSS(`#count`)))
	targets := textOf(t, ctx, "main table")
	require.Contains(t, targets, billing+" (refused: ", "with a Signer the dry run does not offer billing")
	require.Contains(t, textOf(t, ctx, "#refused"), "1 of these messages cannot be replayed to their own queue")

	base, _ := consoleOn(t, b, rc.outcomesTable, nil)
	do(t, ctx, chromedp.Navigate(base+"/q/"+pq+"/g/"+g+"/replay"), chromedp.WaitVisible(chromedp.CSS(`#count`)))
	targets = textOf(t, ctx, "main table")
	require.Contains(t, targets, billing+" (refused: not a consumer queue of this console)", "the dry run shows it refused")
	require.Contains(t, textOf(t, ctx, "#refused"), "1 of these messages cannot be replayed to their own queue")
	confirm(t, ctx, map[string]string{"canary": "1", "ramp": "5", "wait": "10s"})
	require.Equal(t, "Failed.", awaitRun(t, ctx))
	why := textOf(t, ctx, "#why")
	require.Contains(t, why, "event e1: its sluice_poison_queue names")
	require.Contains(t, why, "which is not one of the queues it may publish to ("+b.topo.Config().Queue+")")
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), billing), "nothing reached billing")
	require.Equal(t, []string{"e1"}, peekIDs(t, pq), "it stays in the poison queue")

	// Redirected to the console's own queue, it goes.
	do(t, ctx, chromedp.Navigate(base+"/q/"+pq+"/g/"+g+"/replay"), chromedp.WaitVisible(chromedp.CSS(`#count`)))
	do(t, ctx, chromedp.SetValue(chromedp.CSS(`#to`), b.topo.Config().Queue))
	confirm(t, ctx, map[string]string{"canary": "1", "ramp": "5", "wait": "30s"})
	require.Equal(t, "Done.", awaitRun(t, ctx))
	require.Empty(t, peekIDs(t, pq))
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), billing))
}

// Issue 43, item 1, in the CLI: `sluice dlq replay` replays a message to
// the queue it names only when that queue is of the poison queue's family
// by name (or --target names it), dry run included; --to still redirects.
func TestReplayRefusesAForgedTargetOutsideTheFamily(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.poisoned(t, "good", "order.created", sluice.Poison(errors.New("bad")))
	billing := forgedInto(t, b, "forged")
	pq := b.topo.Config().PoisonQueue

	for _, args := range [][]string{{"--batch", "1"}, {"--dry-run"}} {
		code, _, errOut := b.cli(t, append([]string{"dlq", "replay", "--queue", pq}, args...)...)
		require.Equal(t, 1, code, "%v", args)
		require.Contains(t, errOut, `event forged: its sluice_poison_queue names "`+billing+`", which is not one of the queues of `+pq+`'s family (`+b.topo.Config().Queue+", or a partition", "%v", args)
		require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), billing), "%v: nothing reached billing", args)
	}
	require.Equal(t, []string{"forged"}, peekIDs(t, pq), "the good one went to its own queue; the forged one stays")
	require.Equal(t, []string{"good"}, ids(t, b.topo.Config().Queue))

	// --target names the queues allowed: the forged target only if listed.
	code, _, errOut := b.cli(t, "dlq", "replay", "--queue", pq, "--target", b.topo.Config().Queue, "--dry-run")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "which is not one of the queues it may publish to ("+b.topo.Config().Queue+")")
	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", pq, "--target", b.topo.Config().Queue, "--to", billing)
	require.Equal(t, 1, code, "--to is held to --target too")
	require.Contains(t, errOut, "the queue to replay to")
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", pq, "--to", b.topo.Config().Queue)
	require.Equal(t, 0, code, errOut)
	require.True(t, strings.Contains(out, "replayed 1"), out)
	require.Equal(t, []string{"forged"}, ids(t, b.topo.Config().Queue), "an operator's --to redirects it")
}
