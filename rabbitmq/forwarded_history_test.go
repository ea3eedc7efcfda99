package rabbitmq_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/router"
)

// Issue 28, item 12: two services share a signing key. Service A's handler
// fails its delivery three times, then forwards it (msg.Copy(), published
// straight to service B's queue) with everything it carries: A's attempt 4,
// last error, first failure, origin, retry tier, and a replay run signed for
// A's queue — all under a signature the shared key verifies. B takes it as a
// first delivery: no history, its own ladder (parked twice, processed at its
// third attempt), nothing poisoned, no outcome written into A's run, and
// the history it did not believe logged. Before the fix the signature named
// no queue: B believed attempt 4 and poisoned each event as exhausted at its
// first failure, and recorded the run's item.
func TestAForwardedCopyIsAFirstDeliveryOnAnotherQueue(t *testing.T) {
	t.Parallel()
	signer, withKey := signed(t)
	store := &outcomes{}
	logs := watermill.NewCaptureLogger()
	b := newBrokerStack(t, func(msg *message.Message) error {
		if n, err := sluice.Attempt(msg); err != nil || n < 3 {
			return sluice.Transient(fmt.Errorf("payments: not yet (attempt %d)", n))
		}
		return nil
	}, withKey, func(st *router.Stages) {
		st.Replay = &replay.Config{Store: store}
		st.Logger = logs
	})
	var a *stack
	a = newBrokerStack(t, func(msg *message.Message) error {
		if n, _ := sluice.Attempt(msg); n < 4 {
			return sluice.Transient(errStockTimeout)
		}
		return a.pub.Publish(b.topo.Config().Queue, msg.Copy()) // forwarded as it is
	}, withKey)

	ids := []string{"evt-0", "evt-1", "evt-2"}
	for _, id := range ids {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
		m.Metadata.Set(sluice.EventIDKey, id)
		m.Metadata.Set(replay.RunKey, "run-a")
		m.Metadata.Set(replay.ItemKey, id)
		signer.Sign(m, a.topo.Config().Queue) // a replay to A, as `sluice dlq replay --signing-key-file` signs it
		require.NoError(t, a.pub.Publish(a.topo.Config().Queue, m))
	}
	for _, id := range ids {
		a.handled(t, id, 4)
		first := a.deliveries(id)[3].Metadata
		require.Equal(t, "4", first.Get(sluice.AttemptKey), "%s: A's own history is believed on A's queue", id)
		require.Equal(t, "run-a", first.Get(replay.RunKey))
		b.handled(t, id, 3)
	}
	a.settled(t, 0)
	b.settled(t, 0) // nothing exhausted: before the fix, 3 in B's poison queue

	for _, id := range ids {
		got := b.deliveries(id)
		require.Len(t, got, 3, "%s: B's whole ladder up to its success", id)
		md := got[0].Metadata
		for _, k := range []string{sluice.AttemptKey, sluice.LastErrorKey, sluice.FirstFailedAtKey, sluice.RetryTierKey,
			metakeys.OriginRoutingKey, replay.RunKey, replay.ItemKey} {
			require.Empty(t, md.Get(k), "%s: A's %s is not believed on B's queue", id, k)
		}
		require.Equal(t, id, md.Get(sluice.EventIDKey), "the event itself goes through")
		require.Equal(t, "2", got[1].Metadata.Get(sluice.AttemptKey), "%s: B's own attempts", id)
		require.Equal(t, "3", got[2].Metadata.Get(sluice.AttemptKey))
		require.Contains(t, got[1].Metadata.Get(sluice.LastErrorKey), "payments: not yet", "B's own last error")
		require.Equal(t, b.topo.Config().Queue, got[1].Metadata.Get(metakeys.OriginRoutingKey), "B's own origin")
	}
	b.stop() // every delivery's stages have returned
	require.Empty(t, store.records(), "no outcome written into A's run from B's queue")
	var untrusted int
	for _, l := range logs.Captured()[watermill.InfoLogLevel] {
		if strings.HasPrefix(l.Msg, "Retry history not written by Sluice") && slices.Contains(ids, fmt.Sprint(l.Fields["event_id"])) {
			untrusted++
		}
	}
	require.GreaterOrEqual(t, untrusted, 3, "each forwarded copy's history is logged as not believed")
}

// A retry copy of service A, published as it is into service B's queue
// (replayed onto another queue by hand, or by a producer that captured
// it), is a first delivery there; the same copy back in A's queue is A's
// history. Before the fix B believed attempt 3.
func TestARetryCopyIsNotBelievedOnAnotherQueue(t *testing.T) {
	t.Parallel()
	signer, withKey := signed(t)
	handler := func(msg *message.Message) error { return nil }
	a := newBrokerStack(t, handler, withKey)
	b := newBrokerStack(t, handler, withKey)
	for _, s := range []*stack{a, b} {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
		m.Metadata.Set(sluice.EventIDKey, "evt-copy")
		m.Metadata.Set(sluice.AttemptKey, "3")
		m.Metadata.Set(sluice.LastErrorKey, "stock service: timeout")
		signer.Sign(m, a.topo.Config().Queue) // A's retry stage's copy
		require.NoError(t, s.pub.Publish(s.topo.Config().Queue, m))
	}
	a.handled(t, "evt-copy", 1)
	b.handled(t, "evt-copy", 1)
	require.Equal(t, "3", a.deliveries("evt-copy")[0].Metadata.Get(sluice.AttemptKey), "believed on the queue it was signed for")
	require.Empty(t, b.deliveries("evt-copy")[0].Metadata.Get(sluice.AttemptKey), "not on another")
	require.Empty(t, b.deliveries("evt-copy")[0].Metadata.Get(sluice.LastErrorKey))
}
