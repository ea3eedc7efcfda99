package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// The console's pages read as a person reads them, in headless Chromium at
// 1280 px: a queue's name stays on one line (before: "…_inventory.pois" /
// "on", every column a seventh of the table); a group is named by its class
// and reason's shape, which links into it (before: its title was a hash,
// its reason shown twice and its count the only link); the depth chart
// draws the console's own reads of the queues, every SampleInterval, and
// so moves when the queue does (before: one point per load of the page).
func TestConsolePagesReadWell(t *testing.T) {
	t.Parallel()
	b := newBedOn(t, rabbitmq.TopologyConfig{Queue: testenv.Name("nc5_inventory_service"), TierDelays: []time.Duration{time.Minute}})
	for _, order := range []string{"o-17", "o-18"} {
		b.poisoned(t, "evt-"+order, "order.created", sluice.Invariant(errors.New("order "+order+" must exist")))
	}
	b.poisoned(t, "junk-1", "order.created", sluice.Poison(errors.New("payload is not JSON")))
	base, _ := consoleOn(t, b, "", func(cfg *console.Config) { cfg.SampleInterval = 20 * time.Millisecond })
	ctx := browser(t)
	pq := b.topo.Config().PoisonQueue

	do(t, ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible("section table"))
	require.True(t, eval[bool](t, ctx, `[...document.querySelectorAll('section table tbody td:first-child')].every(td => {
		const r = document.createRange(); r.selectNodeContents(td);
		return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size === 1 })`), "every queue name on one line")

	// The chart: the console's reads, and the main queue's depth moving.
	for i := range 3 {
		require.NoError(t, b.pub.Publish(b.topo.Config().Queue, message.NewMessage(watermill.NewUUID(), []byte(`{}`))))
		want := i + 1
		require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue) == want }, 2*time.Minute, 10*time.Millisecond)
		seen := 0 // wait for a read of the console's at this depth: reloads until one shows
		require.Eventually(t, func() bool {
			do(t, ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible("svg.chart"))
			seen++
			points := eval[string](t, ctx, `document.querySelector('svg.chart polyline').getAttribute('points')`)
			return strings.Count(points, ",") > seen+i+1 // more points than this test's loads
		}, 2*time.Minute, 50*time.Millisecond)
	}
	ys := eval[[]string](t, ctx, `[...new Set(document.querySelector('svg.chart polyline').getAttribute('points').split(' ').map(p => p.split(',')[1]))]`)
	require.GreaterOrEqual(t, len(ys), 2, "the line moves with the queue's depth")
	require.Contains(t, textOf(t, ctx, "p.chart-caption"), "one every 20ms while the console runs")

	do(t, ctx, chromedp.Navigate(base+"/q/"+pq+"/groups"), chromedp.WaitVisible("#groups"))
	link := textOf(t, ctx, "#groups a.group")
	require.Equal(t, "invariant: order o-# must exist", link, "the biggest group first, named by its class and reason's shape")
	require.Contains(t, textOf(t, ctx, "#groups tbody tr"), "e.g. invariant: order o-17 must exist", "with an example, the shape having hidden the ids")
	junk := textOf(t, ctx, "#groups tbody tr:nth-child(2)")
	require.Equal(t, 1, strings.Count(junk, "payload is not JSON"), "a reason shown once: %s", junk)

	do(t, ctx, chromedp.Click("#groups a.group"), chromedp.WaitVisible("h1"))
	title := textOf(t, ctx, "h1")
	require.Equal(t, link, title, "the group's page is titled as its link")
	shot(t, ctx, "group-title")
}
