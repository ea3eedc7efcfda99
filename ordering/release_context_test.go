package ordering_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/ordering"
)

var errShutdown = errors.New("the router is closing")

// A released message runs with a deadline of its own, as long as the
// delivery that released it had when it reached the stage, and ends when
// that delivery's context is cancelled for another reason than its
// deadline (a shutdown), with the same cause. The handler holds the
// released message on a channel until the test has cancelled the head's
// context.
func TestAReleasedMessageHasItsOwnDeadlineAndSeesAShutdown(t *testing.T) {
	t.Parallel()
	o, err := ordering.New(ordering.Config{Store: ordering.NewMemoryStore(), Consumer: "ledger", Key: sluice.KeyFromMetadata("account")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	headDone := make(chan struct{})
	released := make(chan context.Context, 1)
	firstRun := true
	h := o.Middleware(func(m *message.Message) ([]*message.Message, error) {
		switch {
		case m.UUID == "a-1" && firstRun: // to a tier: the key waits for it
			firstRun = false
			sluice.Record(m.Context(), func(r *sluice.Report) { r.Outcome, r.Tier = sluice.OutcomeRetried, "30s" })
		case m.UUID == "a-2": // released by a-1's run back from the tier
			released <- m.Context()
			<-headDone
		}
		return nil, nil
	})
	run := func(m *message.Message, ctx context.Context) {
		m.SetContext(ctx)
		_, err := h(m)
		require.NoError(t, err)
	}
	run(msg("a", "a-1"), t.Context())
	run(msg("a", "a-2"), t.Context()) // held behind a-1

	head, cancel := context.WithCancelCause(t.Context())
	head, cancelDeadline := context.WithTimeout(head, time.Hour)
	defer cancelDeadline()
	headDeadline, _ := head.Deadline()
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(msg("a", "a-1"), head)
	}()
	ctx := <-released
	dl, ok := ctx.Deadline()
	require.True(t, ok, "the released message has a deadline")
	require.True(t, dl.After(headDeadline), "its own: %s, not the head's %s", dl, headDeadline)
	require.NoError(t, ctx.Err())
	cancel(errShutdown)
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		require.FailNow(t, "the head's shutdown did not end the released message")
	}
	require.ErrorIs(t, context.Cause(ctx), errShutdown, "the head's shutdown ends the released message too")
	close(headDone)
	<-done
}
