package main

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// producer publishes to an exchange, confirmed, until stopped; ids are the
// message ids the broker confirmed, in order.
type producer struct {
	mu       sync.Mutex
	ids      []string
	progress chan struct{} // a tick per confirmed message, dropped when full
	stop     chan struct{}
	done     chan error
}

func startProducer(t *testing.T, exchange string, first int) *producer {
	t.Helper()
	ch := testenv.Channel(t, testenv.AMQP(t))
	require.NoError(t, ch.Confirm(false))
	p := &producer{progress: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		for i := first; ; i++ {
			select {
			case <-p.stop:
				p.done <- nil
				return
			default:
			}
			id := fmt.Sprintf("e-%d", i)
			dc, err := ch.PublishWithDeferredConfirm(exchange, "", false, false, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)})
			if err == nil && !dc.Wait() {
				err = fmt.Errorf("%s nacked", id)
			}
			if err != nil {
				p.done <- err
				return
			}
			p.mu.Lock()
			p.ids = append(p.ids, id)
			p.mu.Unlock()
			select {
			case p.progress <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.stop:
		default:
			close(p.stop)
			if err := <-p.done; err != nil {
				t.Logf("the producer, stopped at cleanup: %v", err)
			}
		}
	})
	return p
}

// confirmed returns how many messages the broker has confirmed.
func (p *producer) confirmed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}

// await waits until n more messages than now are confirmed.
func (p *producer) await(t *testing.T, n int) {
	t.Helper()
	want := p.confirmed() + n
	deadline := time.After(time.Minute)
	for p.confirmed() < want {
		select {
		case <-p.progress:
		case err := <-p.done:
			require.NoError(t, err)
			t.Fatal("producer stopped")
		case <-deadline:
			t.Fatalf("producer confirmed %d, want %d", p.confirmed(), want)
		}
	}
}

// A classic queue as watermill-amqp's durable pub/sub declares it (durable,
// no arguments, bound to a fanout exchange) moves onto a quorum queue with
// Sluice's topology while a producer keeps publishing: every message ends
// in the new queue — once, but those published between bind and drain,
// which may be there twice (the inbox skips the second) — the old queue is
// empty and unbound, and NewBroker on the new queue succeeds.
func TestMigrateClassicQueueOntoQuorumTopology(t *testing.T) {
	t.Parallel()
	old, ex, q := testenv.Name("legacy"), testenv.Name("legacy_ex"), testenv.Name("migrated")
	testenv.DeleteQueuesAtEnd(t, old, q, q+".retry.1m", q+".poison", "exchange:"+ex)
	conn := testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	require.NoError(t, ch.ExchangeDeclare(ex, amqp.ExchangeFanout, true, false, false, false, nil))
	_, err := ch.QueueDeclare(old, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(old, "", ex, false, nil))

	// Before: Sluice's quorum topology on the old queue is a conflict
	// on the queue type, which no policy changes.
	cfg := rabbitmq.TopologyConfig{Queue: old, TierDelays: []time.Duration{time.Minute}, Quorum: true, DeliveryLimit: 20}
	_, err = rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: cfg})
	ce, ok := errors.AsType[*rabbitmq.ConflictError](err)
	require.True(t, ok, "got %v", err)
	require.Equal(t, "x-queue-type", ce.Argument)
	require.Contains(t, err.Error(), "sluice topology migrate")
	testenv.DeleteQueuesAtEnd(t, old+".retry.1m", old+".poison") // declared before the conflict

	const backlog = 200
	pub := testenv.Channel(t, conn)
	require.NoError(t, pub.Confirm(false))
	for i := range backlog {
		id := fmt.Sprintf("e-%d", i)
		dc, err := pub.PublishWithDeferredConfirm(ex, "", false, false, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)})
		require.NoError(t, err)
		require.True(t, dc.Wait())
	}
	p := startProducer(t, ex, backlog)
	p.await(t, 5)

	b := &bed{audit: t.TempDir() + "/audit.jsonl"}
	step := func(name string, extra ...string) []string {
		return append([]string{"topology", "migrate", name, "--queue", q, "--tiers", "1m", "--quorum", "--delivery-limit", "20", "--from", old, "--binding", ex + "="}, extra...)
	}

	// No binding to copy: a usage error that says why.
	code, _, errOut := b.cli(t, "topology", "migrate", "bind", "--queue", q, "--from", old)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "AMQP cannot list a queue's bindings")

	// The dry run changes nothing.
	code, out, errOut := b.cli(t, step("bind")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "bind "+q+" to exchange "+ex)
	require.Contains(t, out, "dry run")
	_, err = inspect(conn, q)
	require.Error(t, err, "a dry run declared %s", q)

	bound := p.confirmed() // from here on, a message may be in both queues
	code, out, errOut = b.cli(t, step("bind", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "next: switch the consumers")
	p.await(t, 20) // published into both queues

	// A consumer still on the old queue: drain refuses.
	cch := testenv.Channel(t, conn)
	require.NoError(t, cch.Qos(1, 0, false))
	_, err = cch.Consume(old, "legacy-consumer", false, false, false, false, nil)
	require.NoError(t, err)
	code, _, errOut = b.cli(t, step("drain", "--yes")...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "still has 1 consumers")
	require.NoError(t, cch.Cancel("legacy-consumer", false))
	require.NoError(t, cch.Close()) // its unacked deliveries go back to the old queue

	code, out, errOut = b.cli(t, step("drain", "--yes", "--delete-old")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "unbound "+old)
	require.Contains(t, out, "deleted "+old)
	drained := p.confirmed()
	p.await(t, 20) // only into the new queue
	close(p.stop)
	require.NoError(t, <-p.done)

	_, err = inspect(conn, old)
	require.Error(t, err, "%s not deleted", old)
	// Rerun: nothing left to drain, exit 0.
	code, out, errOut = b.cli(t, step("drain", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "nothing to drain")

	count := map[string]int{}
	for _, d := range testenv.Drain(t, conn, q) {
		count[d.MessageId]++
	}
	p.mu.Lock()
	ids := p.ids
	p.mu.Unlock()
	for i := range backlog + len(ids) {
		id := fmt.Sprintf("e-%d", i)
		n := count[id]
		delete(count, id)
		overlap := i >= backlog+bound && i < backlog+drained+1
		switch {
		case n == 0:
			t.Errorf("%s lost", id)
		case n == 2 && overlap: // in both queues between bind and drain: the inbox skips one
		case n != 1:
			t.Errorf("%s in %s %d times", id, q, n)
		}
	}
	require.Empty(t, count, "messages nobody published")

	broker, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology: rabbitmq.TopologyConfig{Queue: q, TierDelays: []time.Duration{time.Minute}, Quorum: true, DeliveryLimit: 20}})
	require.NoError(t, err)
	require.NoError(t, broker.Close())
}

// `sluice topology migrate drain` on a broker whose channels stop
// answering at any point of it (the connection alive, its heartbeats
// coming) exits with an error: each of its calls is bounded (callTimeout;
// the topology's declaration, 70 s; a moved message's confirm, 30 s).
// The run through a proxy that answers everything counts its channels'
// frames; then, for each k of them, a run whose proxy answers the first k
// and none after ends, with an error or (the last frames, a channel's
// close-ok) its work done. Before, the first silent call waited as long as
// the heartbeats came.
func TestMigrateGivesUpABrokerWhoseChannelsNeverAnswer(t *testing.T) {
	t.Parallel()
	// prepare makes a queue to drain, with one message, and a proxy that
	// answers the first silentAfter frames of the broker's channels (every
	// one when negative); it returns the proxy and the command's arguments.
	prepare := func(silentAfter int) (*testenv.Proxy, []string) {
		old, q := testenv.Name("legacy_silent"), testenv.Name("migrated_silent")
		testenv.DeleteQueuesAtEnd(t, old, q, q+".retry.1m", q+".poison")
		ch := testenv.Channel(t, testenv.AMQP(t))
		_, err := ch.QueueDeclare(old, true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.PublishWithContext(t.Context(), "", old, false, false, amqp.Publishing{MessageId: "m-1", Body: []byte("x")}))
		proxy, url := testenv.ProxyAMQP(t)
		if silentAfter >= 0 {
			proxy.SilenceChannelsFrom(1, silentAfter)
		}
		return proxy, []string{"--amqp-url", url, "--audit", filepath.Join(t.TempDir(), "audit.jsonl"), "--operator", "tester",
			"topology", "migrate", "drain", "--yes", "--delete-old", "--queue", q, "--tiers", "1m", "--from", old, "--binding", "amq.fanout="}
	}
	type result struct {
		code int
		out  string
	}
	drain := func(args []string) result {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return result{code, out.String() + errOut.String()}
	}
	proxy, args := prepare(-1)
	r := drain(args)
	require.Equal(t, 0, r.code, r.out)
	require.Contains(t, r.out, "deleted ")
	frames := proxy.ChannelFrames()

	// Every k at once: the runs wait on the broker, side by side.
	results := make([]result, frames)
	var wg sync.WaitGroup
	for k := range frames {
		_, args := prepare(k)
		wg.Go(func() { results[k] = drain(args) })
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(5 * time.Minute):
		t.Fatalf("a migrate drain still waits on a broker whose channels stopped answering; the goroutines:\n%s", testenv.Goroutines())
	}
	for k, r := range results {
		// An error, or the work done: the last frames answer a channel's
		// close, whose error nothing reads.
		require.True(t, r.code == 1 || r.code == 0 && strings.Contains(r.out, "deleted "), "silent after %d of %d frames: exit %d: %s", k, frames, r.code, r.out)
	}
}
