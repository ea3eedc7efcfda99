package sluicetest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/sluicetest"
)

// The poison queue refuses a copy (a negative confirm): the poison stage
// parks it in the first tier, and when it comes back it goes to the poison
// queue without running the handler.
func TestThePoisonQueueNacks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.FailPublishes(sluicetest.ToPoison, 1, sluicetest.ErrNacked)
	h.Publish("malformed", sluicetest.Message("evt-1", []byte(`{`)))
	h.Settle()
	h.RequireOutcomes("malformed", "parked", "poisoned (poison)")
	tr := h.Trace("malformed")
	require.True(t, tr[0].Ran)
	require.False(t, tr[1].Ran, "the parked copy goes to the poison queue without the handler")
	require.Equal(t, 30*time.Second, tr[1].At, "it waited in the first tier")
}

// The first tier cannot be reached (its publish is unroutable): the retry
// stage sends the copy on to the next tier, which waits longer, rather than
// lose it or spin.
func TestARetryTierIsUnroutable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.FailPublishes(sluicetest.ToTier, 1, sluicetest.ErrUnroutable)
	h.Publish("slow", pay("evt-1", payment{Fail: "transient", Attempts: 1}))
	h.Settle()
	h.RequireOutcomes("slow", "retried to tier 2", "processed, produced receipt:evt-1")
	require.Equal(t, 5*time.Minute, h.Trace("slow").Last().At)
	h.RequireProcessedOnce("slow")
}

// The commit fails after the handler succeeded: its writes and its outbox
// row roll back, the delivery retries as Transient, and is processed once.
func TestTheCommitFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.FailCommits(1)
	h.Publish("payment", pay("evt-1", payment{}))
	h.Settle()
	h.RequireOutcomes("payment", "retried to tier 1", "processed, produced receipt:evt-1")
	h.RequireProduced("payment", "receipt:evt-1")
	require.Equal(t, 1, payments(t, h))
}

// The process crashes between the commit and the ack: the broker delivers
// the message again and the inbox acks the redelivery as a duplicate.
func TestACrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.CrashAfterCommit(1)
	h.Publish("payment", pay("evt-1", payment{}))
	h.Settle()
	h.RequireOutcomes("payment", "processed, produced receipt:evt-1, crashed before the ack", "duplicate")
	h.RequireProcessedOnce("payment")
	h.RequireDuplicate("payment")
	h.RequireProduced("payment", "receipt:evt-1")
	require.Equal(t, 1, payments(t, h))
}

// A duplicate delivery of one event id has no second effect.
func TestADuplicateDelivery(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.Publish("first", pay("evt-1", payment{}))
	h.Wait()
	h.Publish("second", pay("evt-1", payment{}))
	h.Settle()
	h.RequireProcessedOnce("first")
	h.RequireDuplicate("second")
	require.Equal(t, 1, payments(t, h))
	require.Len(t, h.Relayed(), 1)
}

// The card service is unreachable for two minutes: the brake engages
// after 25 of the last 50 deliveries failed so, holds the rest back
// unprocessed (no attempt, no tier spent), probes on its cool-downs, and
// releases once the service answers; every payment is processed once and
// none is poisoned.
func TestTheBrakeHoldsWhileADependencyIsUnreachable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.Unreachable(2 * time.Minute)
	const n = 40
	for i := range n {
		h.Publish(subject(i), pay(subject(i), payment{}))
	}
	h.Settle()
	held, heldSubject := 0, ""
	for i := range n {
		h.RequireProcessedOnce(subject(i))
		for _, s := range h.Trace(subject(i)) {
			if s.Outcome == sluice.OutcomeHeld {
				held, heldSubject = held+1, subject(i)
			}
			require.NotEqual(t, sluice.OutcomePoisoned, s.Outcome)
		}
	}
	require.Positive(t, held)
	h.RequireHeld(heldSubject)
	require.Equal(t, n, payments(t, h))
	require.GreaterOrEqual(t, h.Now(), 2*time.Minute)
}

func subject(i int) string { return "payment " + string(rune('A'+i%26)) + string(rune('a'+i/26)) }

// A shutdown in the middle of a handler: once the grace runs out its
// context ends, the delivery goes back to the queue unprocessed (requeued,
// no attempt spent), and its writes rolled back.
func TestAShutdownMidHandler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.Publish("slow", pay("evt-1", payment{Fail: "block"}))
	ctx := <-blocked
	require.NoError(t, h.Shutdown())
	require.Error(t, ctx.Err(), "the handler's context ended after the grace")
	h.RequireOutcomes("slow", "requeued")
	require.Equal(t, []string{"slow"}, h.Unfinished())
}

// The broker refuses what the relay publishes: the produced row stays in
// the outbox until a later publish goes, and is published once; the
// delivery itself was processed once.
func TestTheRelaysPublishIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.FailPublishes(sluicetest.ToRelay, 1, sluicetest.ErrUnroutable)
	h.Publish("payment", pay("evt-1", payment{}))
	h.Settle()
	h.RequireOutcomes("payment", "processed, produced receipt:evt-1")
	h.RequireProduced("payment", "receipt:evt-1")
	st, err := h.Service().Stores().Outbox.Stats(t.Context())
	require.NoError(t, err)
	require.Zero(t, st.Pending)
}
