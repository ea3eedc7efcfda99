package amqpcall_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/amqpframe"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// through dials the test broker through a proxy with rabbitmq.Dial (the
// frame filter under it: the connection's progress is known), with query
// added to the URL, and opens a channel; both are closed when t ends.
func through(t *testing.T, query string) (*testenv.Proxy, *amqp.Connection, *amqp.Channel) {
	t.Helper()
	proxy, url := testenv.ProxyAMQP(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url + query}, "amqpcall test")
	require.NoError(t, err)
	t.Cleanup(func() { _ = amqpcall.Close(context.Background(), conn, time.Second) })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return proxy, conn, ch
}

// queued declares a queue named from prefix on the test broker, deleted
// when t ends, and puts a message of body in it, directly (no proxy).
func queued(t *testing.T, prefix string, body []byte) string {
	t.Helper()
	queue := testenv.Name(prefix)
	testenv.DeleteQueuesAtEnd(t, queue)
	direct := testenv.Channel(t, testenv.AMQP(t))
	_, err := direct.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, testenv.Confirm(t, direct).PublishWithContext(t.Context(), "", queue, false, false, amqp.Publishing{Body: body}))
	return queue
}

// A basic.get whose message takes longer than the bound to arrive — 4 MiB
// at 1 MiB/s, a slow link or a loaded host — is waited for while its
// frames keep coming. Before, the bound counted the transfer: the get
// failed after 3 s with "the broker gave no answer within 3s (connection
// closed)", as a 4 MiB message did after dlq's 10 s at a load average of
// 19-37 (cmd/sluice.TestArchiveTableKeepsALargeBinaryPayload).
func TestALargeAnswerOverASlowLinkIsWaitedFor(t *testing.T) {
	t.Parallel()
	body := make([]byte, 4<<20)
	for i := range body {
		body[i] = byte(i * 7)
	}
	queue := queued(t, "amqpcall_large", body)

	proxy, conn, ch := through(t, "")
	proxy.Throttle(1 << 20)
	const bound = 3 * time.Second
	var (
		d   amqp.Delivery
		err error
	)
	took := testenv.Within(t, amqpcall.LimitFactor*bound+time.Minute, "the get", func() {
		d, err = amqpcall.Do(context.Background(), conn, bound, "basic.get from "+queue, func() (amqp.Delivery, error) {
			d, ok, err := ch.Get(queue, true)
			if err == nil && !ok {
				err = errors.New("the queue is empty")
			}
			return d, err
		})
	})
	require.NoError(t, err)
	require.Equal(t, body, d.Body)
	require.Greater(t, took, bound, "the transfer outlasted the bound (the throttle's doing), or the test shows nothing")
	t.Logf("4 MiB at 1 MiB/s in %s, bound %s", took.Round(time.Millisecond), bound)
}

// A basic.get whose message stops coming half-way — the broker's frames
// no longer forwarded once the first ones arrived — is given up its bound
// after the last of it, and the error says when it stopped.
func TestAnAnswerThatStopsComingIsGivenUp(t *testing.T) {
	t.Parallel()
	queue := queued(t, "amqpcall_stops", make([]byte, 4<<20))

	proxy, conn, ch := through(t, "")
	proxy.Throttle(1 << 20)
	moved := amqpframe.Progress(conn)
	require.NotNil(t, moved, "rabbitmq.Dial's connection is in the registry")
	const bound = 2 * time.Second
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := amqpcall.Do(context.Background(), conn, bound, "basic.get from "+queue, func() (amqp.Delivery, error) {
			d, _, err := ch.Get(queue, false)
			return d, err
		})
		done <- err
	}()
	require.Eventually(t, func() bool { return moved().After(start) }, time.Minute, 10*time.Millisecond, "the answer began to arrive")
	proxy.HeartbeatsOnly()
	var err error
	select {
	case err = <-done:
	case <-time.After(amqpcall.LimitFactor*bound + time.Minute):
		t.Fatal("the get did not return")
	}
	require.True(t, errors.Is(err, amqpcall.ErrNoAnswer), "%v", err)
	require.ErrorContains(t, err, "basic.get from "+queue+": the broker gave no answer within "+bound.String()+": it stopped coming ")
	require.ErrorContains(t, err, "into the call (connection closed)")
	t.Logf("%v", err)
}

// A call whose answer does not come is given up after its bound though the
// broker's heartbeats keep arriving — the broker's connection alive, its
// channel's answer stuck — which the client's own heartbeat never gives up:
// heartbeats are not the answer's progress. The passive declare is
// answered by the broker; the proxy forwards only its heartbeats.
func TestACallIsGivenUpThoughHeartbeatsCome(t *testing.T) {
	t.Parallel()
	// A heartbeat of 2 s: the broker sends one a second, the client gives
	// the connection up after 3 s without a frame; both well inside the
	// test's patience, and the bound sees some.
	proxy, conn, ch := through(t, "?heartbeat=2")
	queue := testenv.Name("amqpcall_stuck")
	proxy.HeartbeatsOnly()
	const bound = 4 * time.Second
	var err error
	testenv.Within(t, bound+30*time.Second, "the declare", func() {
		_, err = amqpcall.Do(context.Background(), conn, bound, "a passive declare of "+queue, func() (amqp.Queue, error) {
			return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		})
	})
	require.True(t, errors.Is(err, amqpcall.ErrNoAnswer), "%v", err)
	require.ErrorContains(t, err, "a passive declare of "+queue+": the broker gave no answer within "+bound.String()+" (connection closed)")
	require.Positive(t, proxy.Heartbeats(), "the broker's heartbeats reached the client while it waited")
}
