package main

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
)

// TestCrashLoopDeadLetterShowsTheBrokersDiagnosis: a quorum queue with
// DeliveryLimit 2 whose consumer returns the message every time (as a
// process that crashes on it does) until RabbitMQ dead-letters it to the
// poison queue, beside a message the poison stage isolated. The CLI shows
// the broker's diagnosis — class broker:delivery_limit, the reason, the
// queue it died in, the count — and stats --class selects it. Before:
// class (none), reason and queue "-", and --class broker:delivery_limit a
// usage error.
func TestCrashLoopDeadLetterShowsTheBrokersDiagnosis(t *testing.T) {
	t.Parallel()
	b := newQuorumBed(t, 2)
	b.poisoned(t, "p1", "order.created", sluice.Poison(errors.New("bad")))
	crash := message.NewMessage(watermill.NewUUID(), []byte(`{"eventId":"crash-1"}`))
	crash.Metadata.Set(sluice.EventIDKey, "crash-1")
	require.NoError(t, b.pub.Publish(b.topo.Config().Queue, crash))

	conn := testenv.AMQP(t)
	deliveries, err := testenv.Channel(t, conn).Consume(b.topo.Config().Queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	returns := 0
	for testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue) < 2 {
		select {
		case d := <-deliveries:
			require.NoError(t, d.Nack(false, true)) // the consumer "crashes" on it
			returns++
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the delivery limit did not dead-letter the message (%d returns)", returns)
		}
	}
	require.Equal(t, 3, returns, "DeliveryLimit 2: dead-lettered on the third return")

	code, out, errOut := b.cli(t, "dlq", "inspect", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "broker:delivery_limit (event crash-1)")
	require.Contains(t, out, "delivery_limit: dead-lettered by RabbitMQ from queue "+b.topo.Config().Queue+" (x-death count 1), no Sluice diagnosis")
	require.Regexp(t, `queue\s+│ `+b.topo.Config().Queue+`\s`, out, "the queue it died in")
	require.Contains(t, out, "poison (event p1)", "Sluice's own diagnosis is shown as before")

	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `broker:delivery_limit\s+│\s+1`, out)
	require.NotRegexp(t, `(?s)CLASS.*\(none\).*ERROR FINGERPRINT`, out, "no class (none)")

	for class, want := range map[string]int{"broker:delivery_limit": 1, "poison": 1, "broker:expired": 0} {
		code, out, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--class", class, "--json")
		require.Equal(t, 0, code, errOut)
		var s dlq.Stats
		require.NoError(t, json.Unmarshal([]byte(out), &s))
		require.Equal(t, want, s.Total, "--class %s", class)
		require.Equal(t, 2, s.Scanned)
	}
	code, _, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--class", "broker:")
	require.Equal(t, 2, code, "a broker class names its reason")
	require.Contains(t, errOut, "broker:<reason>")
}
