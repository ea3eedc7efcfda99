package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// fillPoison publishes n poisoned messages (e-<from>…) of one group into
// b's poison queue.
func fillPoison(t *testing.T, b *bed, from, n int) {
	t.Helper()
	var ms []*message.Message
	for i := from; i < from+n; i++ {
		ms = append(ms, poisonedCopy(b, i, time.Time{}))
	}
	require.NoError(t, b.pub.Publish(b.topo.Config().PoisonQueue, ms...))
}

// poisonedCopy is poisoned message i (e-<i>) of b's one group, poisoned at
// at (zero: no poisoned-at header).
func poisonedCopy(b *bed, i int, at time.Time) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"eventId":"e-%d"}`, i))
	m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("e-", i))
	m.Metadata.Set(metakeys.PoisonClass, "poison")
	m.Metadata.Set(metakeys.PoisonReason, fmt.Sprintf("order o-%d failed: no such customer", i))
	m.Metadata.Set(metakeys.PoisonConsumer, "orders")
	m.Metadata.Set(metakeys.PoisonQueue, b.topo.Config().Queue)
	if !at.IsZero() {
		m.Metadata.Set(metakeys.PoisonedAt, at.UTC().Format(time.RFC3339Nano))
	}
	return m
}

// getPage reads the page at u, which must answer 200.
func getPage(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	return string(body)
}

// groupsPage reads the groups page (fresh: read again) and returns the
// total it shows and when its summary was read.
func groupsPage(t *testing.T, base, queue string, fresh bool) (total int, readAt string) {
	t.Helper()
	url := base + "/q/" + queue + "/groups"
	if fresh {
		url += "?fresh=1"
	}
	body := getPage(t, url)
	m := regexp.MustCompile(`<p>(\d+) messages`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	total, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	if at := regexp.MustCompile(`data-at="(\d+)"`).FindStringSubmatch(body); at != nil {
		readAt = at[1]
	}
	return total, readAt
}

// Two views of one poison queue at once: the second waits for the first
// to put back what it read, and counts the whole queue. Before, the second
// read the queue while the first held what it had read, and counted only
// the rest (and, on a quorum queue, their put-backs interleaved).
func TestConsoleReadsAPoisonQueueOneReaderAtATime(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	const n = 1500
	fillPoison(t, b, 0, n)
	base, _ := consoleOn(t, b, "", func(c *console.Config) { c.CallTimeout = 2 * time.Minute })
	first := make(chan int, 1)
	go func() {
		total, _ := groupsPage(t, base, b.topo.Config().PoisonQueue, true)
		first <- total
	}()
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue) < n }, time.Minute, time.Millisecond,
		"the first view is reading the queue")
	second, _ := groupsPage(t, base, b.topo.Config().PoisonQueue, true)
	require.Equal(t, n, <-first)
	require.Equal(t, n, second, "the second view waited for the first's put-back")
}

// The groups page answers from its last scan while the queue holds as many
// messages and the scan is younger than a minute; a change of depth or
// "read again" scans again.
func TestConsoleGroupsPageKeepsItsSummary(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	fillPoison(t, b, 0, 30)
	base, _ := consoleOn(t, b, "", nil)
	q := b.topo.Config().PoisonQueue
	total, at1 := groupsPage(t, base, q, false)
	require.Equal(t, 30, total)
	require.NotEmpty(t, at1, "the page says when its summary was read")
	total, at2 := groupsPage(t, base, q, false)
	require.Equal(t, 30, total)
	require.Equal(t, at1, at2, "answered from the summary")
	fillPoison(t, b, 30, 1)
	total, at3 := groupsPage(t, base, q, false)
	require.Equal(t, 31, total, "the depth changed: read again")
	require.NotEqual(t, at1, at3)
	_, at4 := groupsPage(t, base, q, true)
	require.NotEqual(t, at3, at4, "read again when asked")
}

// With --management-url the console's overview shows each queue's unacked
// messages and arrival rate, read from RabbitMQ's management API (the
// package's private node with the plugin, in a vhost of the test's own):
// a producer publishing into orders shows as an arrival rate, a consumer
// holding a delivery as unacked.
func TestConsoleOverviewReadsTheManagementAPI(t *testing.T) {
	t.Parallel()
	node, _ := privateNode(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: node.URL}, "test")
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "orders", TierDelays: []time.Duration{time.Minute}})
	require.NoError(t, err)
	_, err = topo.Declare(t.Context(), conn)
	require.NoError(t, err)
	c, err := console.New(console.Config{
		Dial:     func() (*amqp.Connection, error) { return amqp.Dial(node.URL) },
		Queues:   []console.Queue{{Name: "orders", Tiers: []string{topo.Tiers()[0].Topic}, Poison: topo.Config().PoisonQueue}},
		Depth:    managementDepth(node.ManagementURL, node.URL),
		ReadOnly: true,
	})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(func() { srv.Close(); require.NoError(t, c.Close()) })

	// A producer, 20 messages a second until the test ends; a consumer
	// holding one delivery.
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", "orders", false, false, amqp.Publishing{Body: []byte(`{}`)}))
	held, err := ch.Consume("orders", "", false, false, false, false, nil)
	require.NoError(t, err)
	<-held
	stop := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		pch, err := conn.Channel()
		if err != nil {
			produced <- err
			return
		}
		defer func() { _ = pch.Close() }()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				produced <- nil
				return
			case <-tick.C:
				if err := pch.Publish("", topo.Config().PoisonQueue, false, false, amqp.Publishing{Body: []byte(`{}`)}); err != nil {
					produced <- err
					return
				}
			}
		}
	}()
	row := regexp.MustCompile(`(?s)<td class="name">(.+?)</td><td>(main|poison)</td><td class="n">(\d+)</td>\s*<td class="n">(\d+)</td>\s*<td class="n">(\d+)</td>\s*<td class="n arrival">([^<]+)</td>`)
	require.EventuallyWithT(t, func(ct *assert.CollectT) { // the management API samples every 5 s
		resp, err := http.Get(srv.URL + "/")
		require.NoError(ct, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(ct, err)
		rows := map[string][]string{}
		for _, m := range row.FindAllStringSubmatch(string(body), -1) {
			rows[m[2]] = m[3:]
		}
		require.Len(ct, rows["main"], 4, string(body))
		require.Len(ct, rows["poison"], 4, string(body))
		require.Equal(ct, []string{"0", "1", "1"}, rows["main"][:3], "orders: 0 ready, 1 unacked, 1 consumer")
		require.Regexp(ct, `^[1-9]\d*\.\d/s$|^[2-9]\d*\.\d/min$`, rows["poison"][3], "the poison queue's arrival rate")
	}, time.Minute, 200*time.Millisecond)
	close(stop)
	require.NoError(t, <-produced)
}

// A replay redirected to another consumer queue of the console: the
// preview offers the console's consumer queues, the closed loop publishes
// each copy there, and the outcome column fills from that consumer's
// records (every message processed by it). A queue the console does not
// show is refused, nothing moved.
func TestConsoleRedirectsAReplayToAnotherConsumerQueue(t *testing.T) {
	t.Parallel()
	from, to := newBed(t), newBed(t)
	for i := range 4 {
		from.poisoned(t, fmt.Sprintf("moved-%d", i), "stock.reserved", sluice.NewFailure(sluice.ClassExhausted, errors.New("stock service: timeout")))
	}
	rc := newRecovering(t, to, func(string) bool { return false })
	pq := from.topo.Config().PoisonQueue
	base, _ := consoleOn(t, from, rc.outcomesTable, func(c *console.Config) {
		c.Queues = append(c.Queues, console.Queue{Name: to.topo.Config().Queue, Tiers: []string{to.topo.Tiers()[0].Topic}, Poison: to.topo.Config().PoisonQueue})
	})
	g := groupOf(t, pq, "moved-0")
	preview := getPage(t, base+"/q/"+pq+"/g/"+g+"/replay")
	require.Contains(t, preview, `<option value="`+to.topo.Config().Queue+`">`)
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(preview)
	require.NotNil(t, csrf)
	post := func(target string) (int, string) {
		form := url.Values{"csrf": {csrf[1]}, "confirm": {"yes"}, "canary": {"1"}, "ramp": {"5"}, "wait": {"60s"}, "to": {target}}
		cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := cl.PostForm(base+"/q/"+pq+"/g/"+g+"/replay", form)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Location") + string(body)
	}
	code, body := post("not-" + to.topo.Config().Queue)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "not a consumer queue of this console")
	require.Len(t, peekIDs(t, pq), 4, "nothing moved")

	code, run := post(to.topo.Config().Queue)
	require.Equal(t, http.StatusSeeOther, code)
	require.Eventually(t, func() bool { return rc.rows(t) == 4 }, time.Minute, 20*time.Millisecond, "processed by the other consumer")
	require.Eventually(t, func() bool {
		page := getPage(t, strings.Split(base, "/sluice")[0]+run)
		return strings.Contains(page, `<span class="ok">Done.</span>`) && strings.Count(page, `<td class="outcome outcome-processed">processed</td>`) == 4
	}, time.Minute, 50*time.Millisecond, "the run's outcome column, from the other consumer's records")
	require.Empty(t, peekIDs(t, pq))
	audit, err := os.ReadFile(from.audit)
	require.NoError(t, err)
	require.Contains(t, string(audit), `"to":"`+to.topo.Config().Queue+`"`)
}

// The groups page charts each group's arrivals by hour over the last 24
// hours, from the messages' poisoned-at times: 3 this hour, 2 two hours
// ago, one 30 hours ago (outside the chart, still counted in the group).
func TestConsoleGroupsChartArrivalsByHour(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	now := time.Now()
	var ms []*message.Message
	for i, ago := range []time.Duration{0, 0, 0, 2 * time.Hour, 2 * time.Hour, 30 * time.Hour} {
		ms = append(ms, poisonedCopy(b, i, now.Add(-ago)))
	}
	require.NoError(t, b.pub.Publish(b.topo.Config().PoisonQueue, ms...))
	base, _ := consoleOn(t, b, "", nil)
	body := getPage(t, base+"/q/"+b.topo.Config().PoisonQueue+"/groups")
	bars := regexp.MustCompile(`<rect class="bar" [^>]*data-n="(\d+)" data-hour="(\d\d:\d\d)"`).FindAllStringSubmatch(body, -1)
	require.Len(t, bars, 24, "one group, 24 hours")
	counts := map[string]string{}
	for _, b := range bars {
		if b[1] != "0" {
			counts[b[2]] = b[1]
		}
	}
	hour := func(ago time.Duration) string { return now.Add(-ago).UTC().Truncate(time.Hour).Format("15:04") }
	require.Equal(t, map[string]string{hour(0): "3", hour(2 * time.Hour): "2"}, counts)
	require.Contains(t, body, "<p>6 messages", "the older one is counted in the group")
}
