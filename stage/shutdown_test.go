package stage_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

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
