package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	_ "github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
)

// fillPoison publishes n poisoned messages (e-<from>…) of one group into
// b's poison queue.
func fillPoison(t *testing.T, b *bed, from, n int) {
	t.Helper()
	var ms []*message.Message
	for i := from; i < from+n; i++ {
		m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"eventId":"e-%d"}`, i))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("e-", i))
		m.Metadata.Set(poison.ClassKey, "poison")
		m.Metadata.Set(poison.ReasonKey, fmt.Sprintf("order o-%d failed: no such customer", i))
		m.Metadata.Set(poison.ConsumerKey, "orders")
		m.Metadata.Set(poison.QueueKey, b.topo.Queue())
		ms = append(ms, m)
	}
	require.NoError(t, b.pub.Publish(b.topo.PoisonQueue(), ms...))
}

// groupsPage reads the groups page (fresh: read again) and returns the
// total it shows and when its summary was read.
func groupsPage(t *testing.T, base, queue string, fresh bool) (total int, readAt string) {
	t.Helper()
	url := base + "/q/" + queue + "/groups"
	if fresh {
		url += "?fresh=1"
	}
	resp, err := http.Get(url)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	m := regexp.MustCompile(`<p>(\d+) messages`).FindSubmatch(body)
	require.NotNil(t, m, string(body))
	total, err = strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	if at := regexp.MustCompile(`data-at="(\d+)"`).FindSubmatch(body); at != nil {
		readAt = string(at[1])
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
	base, _ := consoleOn(t, b, "", nil)
	first := make(chan int, 1)
	go func() {
		total, _ := groupsPage(t, base, b.topo.PoisonQueue(), true)
		first <- total
	}()
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, b.topo.PoisonQueue()) < n }, time.Minute, time.Millisecond,
		"the first view is reading the queue")
	second, _ := groupsPage(t, base, b.topo.PoisonQueue(), true)
	require.Equal(t, n, <-first)
	require.Equal(t, n, second, "the second view waited for the first's put-back")
}

// The groups page answers from its last scan while the queue holds as many
// messages and the scan is younger than SummaryMaxAge; a change of depth or
// "read again" scans again.
func TestConsoleGroupsPageKeepsItsSummary(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	fillPoison(t, b, 0, 30)
	base, _ := consoleOn(t, b, "", nil)
	q := b.topo.PoisonQueue()
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
