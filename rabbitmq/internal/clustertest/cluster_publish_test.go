package clustertest_test

import (
	"errors"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A publisher whose node is killed mid-stream — the node leading the
// quorum queue, with a batch whose confirms are lost with the connection —
// reports each of those messages as an error matching
// sluice.ErrPublishUncertain, never as a success, and goes on publishing
// through another node. Read from a third node afterwards, the queue holds
// every message reported confirmed, exactly once, none reported as
// certainly not stored, and every message has an outcome.
//
// Publishes during the leader election are nacked, and RabbitMQ 3.10 went on
// nacking every publish on the channel that saw such a nack while a new
// channel's were confirmed: before the Publisher replaced a channel after a
// nack, this test failed, no batch confirmed within 30 s of the kill.
func TestClusterPublisherNodeKilledMidStream(t *testing.T) {
	t.Parallel()
	c := privateCluster(t)
	topo := declareOnNode(t, c, 0, "cluster_pub")
	q := topo.Config().Queue

	// Node 0 is reached through a proxy that can drop its replies: a batch
	// is then surely in flight, its confirms lost, when the node dies.
	u, err := url.Parse(c.URLs[0])
	require.NoError(t, err)
	proxy := testenv.StartProxy(t, u.Host)
	u.Host = proxy.Addr()
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{
		Connection:     rabbitmq.Connection{URLs: []string{u.String(), c.URLs[1], c.URLs[2]}, DialTimeout: 5 * time.Second},
		ConfirmTimeout: 30 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	// Each publisher goes on until afterKill of its batches were confirmed
	// whole after the kill, or until none was for a minute since the kill
	// or the last one (not a fixed time from the start: a loaded machine
	// takes its time over the 500 before the kill).
	const publishers, batch, afterKill, stall = 4, 25, 10, time.Minute
	var (
		mu        sync.Mutex
		outcome   = map[string]error{} // body → nil (confirmed) or the error
		accepted  atomic.Int64
		killed    = make(chan struct{})
		lastWhole atomic.Int64 // unix ns of the kill, then of each batch confirmed whole after it
		muted     atomic.Bool  // node 0's replies are dropped: it confirms nothing more
		resumed   time.Time    // the first batch begun after that, confirmed whole: through another node
		wg        sync.WaitGroup
	)
	for g := range publishers {
		wg.Go(func() {
			after := 0
			for b := 0; after < afterKill; b++ {
				wasKilled, wasMuted := false, muted.Load()
				select {
				case <-killed:
					wasKilled = true
				default:
				}
				if wasKilled && time.Since(time.Unix(0, lastWhole.Load())) > stall {
					return
				}
				msgs := make([]*message.Message, batch)
				for k := range msgs {
					msgs[k] = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(g)+"-"+strconv.Itoa(b)+"-"+strconv.Itoa(k)))
				}
				errs := p.PublishEach(q, msgs...)
				mu.Lock()
				whole := true
				for k, err := range errs {
					outcome[string(msgs[k].Payload)] = err
					if err == nil {
						accepted.Add(1)
					}
					whole = whole && err == nil
				}
				if wasKilled && whole {
					after++
					lastWhole.Store(time.Now().UnixNano())
				}
				if wasMuted && whole && resumed.IsZero() {
					resumed = time.Now()
				}
				mu.Unlock()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	defer func() { // a failure below must not leave the publishers behind
		select {
		case <-killed:
		default:
			close(killed)
		}
		<-done
	}()

	t0 := time.Now()
	phase := func(what string) { t.Logf("%s: %s", time.Since(t0).Round(time.Millisecond), what) }
	require.NoError(t, testenv.AwaitCount(500, 2*time.Minute, 10*time.Minute, func() int { return int(min(accepted.Load(), 500)) }),
		"publishing through node 0: 500 confirmed")
	phase("500 confirmed")
	proxy.DropReplies()
	muted.Store(true)
	// Node 0 has stored a message whose confirm the publisher will never
	// see: the queue, read from node 1, holds more than it confirmed.
	node1 := dialNode(t, c.URLs[1])
	ch := testenv.Channel(t, node1)
	require.Eventually(t, func() bool {
		stored, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil && int64(stored.Messages) > accepted.Load()
	}, 2*time.Minute, 5*time.Millisecond, "a batch in flight, its confirms dropped")
	phase("a batch in flight")
	start := time.Now()
	killNode(t, c, 0)
	killTook := time.Since(start)
	phase("killed")
	lastWhole.Store(time.Now().UnixNano())
	close(killed)
	<-done // each publisher's batches after the kill, or a minute without one
	require.False(t, resumed.IsZero(), "no batch confirmed after the kill")
	t.Logf("first batch confirmed through another node %s after the SIGKILL of node 0 (%s until its VM was gone), publishers done after %s",
		resumed.Sub(start).Round(time.Millisecond), killTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	stored := drainBodies(t, dialNode(t, c.URLs[2]), q)
	phase("drained")
	var confirmed, uncertain, uncertainStored, certain int
	for body, err := range outcome {
		switch {
		case err == nil:
			confirmed++
			require.Equal(t, 1, stored[body], "message %s was confirmed: stored exactly once", body)
		case errors.Is(err, sluice.ErrPublishUncertain):
			uncertain++
			require.LessOrEqual(t, stored[body], 1, "message %s is stored at most once", body)
			uncertainStored += stored[body]
		default: // nacked, or never sent (its channel closed before the send): certain
			certain++
			require.Zero(t, stored[body], "message %s was reported not stored (%v), but is", body, err)
		}
	}
	for body := range stored {
		_, published := outcome[body]
		require.True(t, published, "stored message %s was not published by the test", body)
	}
	require.Positive(t, uncertain, "the batch in flight at the kill is reported uncertain")
	require.GreaterOrEqual(t, confirmed, 500+publishers*afterKill*batch, "every publisher went on through another node")
	t.Logf("%d messages: %d confirmed (all stored once), %d uncertain (%d of them stored), %d certainly not stored",
		len(outcome), confirmed, uncertain, uncertainStored, certain)
}

// drainBodies takes every message of queue through conn and counts the
// copies of each body: as many as the queue counts by consuming (a
// basic.get each would take seconds for thousands), then the rest with
// basic.get until the queue answers empty. Right after a node's kill a
// quorum queue's count can read 0 (RabbitMQ answers 0 when the leader its
// record names does not answer within 250 ms): a drain bounded by the count
// alone left 1,775 messages in a fresh clone's run. The consumer takes its
// messages with no ack: acked, then returned by the channel's close, a copy
// whose ack the broker had not applied yet came again to basic.get —
// counted twice, in the run after.
func drainBodies(t *testing.T, conn *amqp.Connection, queue string) map[string]int {
	t.Helper()
	ch := testenv.Channel(t, conn)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	deliveries, err := ch.Consume(queue, "drain", true, false, false, false, nil)
	require.NoError(t, err)
	copies := map[string]int{}
	for n := 0; n < q.Messages; n++ {
		select {
		case d, ok := <-deliveries:
			require.True(t, ok, "%d of the %d messages of %s read, then the consumer was cancelled", n, q.Messages, queue)
			copies[string(d.Body)]++
		case <-time.After(time.Minute): // no message for a minute: stuck, not slow
			t.Fatalf("%d of the %d messages of %s read, then none for a minute", n, q.Messages, queue)
		}
	}
	require.NoError(t, ch.Cancel("drain", false))
	for d := range deliveries { // sent before the cancel
		copies[string(d.Body)]++
	}
	for _, d := range testenv.Drain(t, conn, queue) {
		copies[string(d.Body)]++
	}
	return copies
}
