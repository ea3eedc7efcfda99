package stage_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/stage"
)

type ctxKey struct{}

func TestShutdownGrace(t *testing.T) {
	t.Parallel()
	_, err := stage.ShutdownGrace(-time.Second)
	require.Error(t, err)

	// run passes one delivery through a stage of grace whose router begins
	// to close while the handler works; it returns the handler's context's
	// error right after the close began and its cause once it ended (with a
	// grace of an hour it is never awaited).
	run := func(grace time.Duration) (afterCancel, afterGrace, cause error) {
		mw, err := stage.ShutdownGrace(grace)
		require.NoError(t, err)
		orig, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		msg := newMsg()
		msg.SetContext(orig)
		_, err = mw(func(m *message.Message) ([]*message.Message, error) {
			ctx := m.Context()
			require.Equal(t, "v", ctx.Value(ctxKey{}), "values are kept")
			cancel() // the router begins to close
			afterCancel = ctx.Err()
			if grace < time.Hour {
				<-ctx.Done()
				afterGrace, cause = ctx.Err(), context.Cause(ctx)
			}
			return nil, nil
		})(msg)
		require.NoError(t, err)
		require.Equal(t, orig, msg.Context(), "the message's own context is restored")
		return afterCancel, afterGrace, cause
	}
	afterCancel, _, _ := run(time.Hour)
	require.NoError(t, afterCancel, "the handler's context outlives the router's for the grace period")
	_, afterGrace, cause := run(time.Millisecond)
	require.ErrorIs(t, afterGrace, context.Canceled)
	require.ErrorIs(t, cause, stage.ErrShutdownGraceExpired)
}

// A deadline on the message context (Watermill's Timeout) is kept: the
// handler's context ends at the deadline, not a grace period later.
func TestShutdownGraceKeepsTheDeadline(t *testing.T) {
	t.Parallel()
	mw, err := stage.ShutdownGrace(time.Hour)
	require.NoError(t, err)
	orig, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	msg := newMsg()
	msg.SetContext(orig)
	_, err = mw(func(m *message.Message) ([]*message.Message, error) {
		select {
		case <-m.Context().Done():
		case <-time.After(time.Minute):
			t.Error("the deadline did not end the handler's context")
		}
		return nil, m.Context().Err()
	})(msg)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A context that can never be cancelled shields nothing and ends nothing;
// a handler that looks at its context only after the router closed still
// gets its grace, and context.Cause sees the grace's cause.
func TestShutdownGraceLateObserver(t *testing.T) {
	t.Parallel()
	mw, err := stage.ShutdownGrace(30 * time.Millisecond)
	require.NoError(t, err)
	msg := newMsg()
	msg.SetContext(context.Background())
	_, err = mw(func(m *message.Message) ([]*message.Message, error) { return nil, m.Context().Err() })(msg)
	require.NoError(t, err)

	orig, cancel := context.WithCancel(context.Background())
	msg = newMsg()
	msg.SetContext(orig)
	var cause, early error
	_, err = mw(func(m *message.Message) ([]*message.Message, error) {
		cancel() // the router closes before the handler ever looks
		time.Sleep(50 * time.Millisecond)
		early = m.Context().Err() // first look: the grace begins now
		<-m.Context().Done()
		cause = context.Cause(m.Context())
		return nil, nil
	})(msg)
	require.NoError(t, err)
	require.NoError(t, early)
	require.ErrorIs(t, cause, stage.ErrShutdownGraceExpired)
}

// Once the handler has returned, its context is not cancelled: the messages
// it produced carry it to Watermill's publish, after the stack returned. A
// deadline still ends it.
func TestShutdownGraceContextOutlivesTheHandlerForItsProducedMessages(t *testing.T) {
	t.Parallel()
	mw, err := stage.ShutdownGrace(time.Hour)
	require.NoError(t, err)
	for _, looked := range []bool{true, false} {
		msg := newMsg()
		produced, err := mw(func(m *message.Message) ([]*message.Message, error) {
			if looked {
				require.NoError(t, m.Context().Err()) // arms the context, as a driver does
			}
			evt := newMsg()
			evt.SetContext(m.Context())
			return []*message.Message{evt}, nil
		})(msg)
		require.NoError(t, err)
		require.NoError(t, produced[0].Context().Err(), "looked before returning: %v", looked)
	}

	orig, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	msg := newMsg()
	msg.SetContext(orig)
	produced, err := mw(func(m *message.Message) ([]*message.Message, error) {
		evt := newMsg()
		evt.SetContext(m.Context())
		return []*message.Message{evt}, nil
	})(msg)
	require.NoError(t, err)
	<-produced[0].Context().Done()
	require.ErrorIs(t, produced[0].Context().Err(), context.DeadlineExceeded)
}

// A handler that looked at its context's Err while the router was open —
// as a loop that checks ctx.Err() between rows does — behind the inbox (as
// router.Add and service.New stack them) gets the grace from the router's
// close, not from its next look: its context has ended when it looks again
// a grace later. Before, the grace began at that next look (Err while the
// message's context was live set nothing), so a handler that looked seldom
// ran on past grace after Close — past the router's CloseTimeout. (The
// first look while live is free, the inbox's: a handler alone behind the
// stage that looks once before the close gets its grace from its next
// look, as one that never looked.)
func TestShutdownGraceBeginsAtTheCloseForAHandlerThatLookedBefore(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		mw, err := stage.ShutdownGrace(10 * time.Second)
		require.NoError(t, err)
		inbox, err := deduplication.New(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"})
		require.NoError(t, err)
		orig, cancel := context.WithCancel(context.Background())
		msg := newMsg()
		msg.Metadata.Set(sluice.EventIDKey, "evt-1")
		msg.SetContext(orig)
		var before, graceLater error
		_, err = mw(inbox(func(m *message.Message) ([]*message.Message, error) {
			before = m.Context().Err() // the router is open
			cancel()                   // the router begins to close
			synctest.Wait()
			time.Sleep(11 * time.Second) // work that looks at nothing: the grace passes
			graceLater = m.Context().Err()
			return nil, nil
		}))(msg)
		require.NoError(t, err, "a handler that returned nil is committed")
		require.NoError(t, before)
		require.ErrorIs(t, graceLater, context.Canceled, "the grace ran from the close")
	})
}
