package middleware_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/middleware"
)

type ctxKey struct{}

func TestShutdownGrace(t *testing.T) {
	t.Parallel()
	mw, err := middleware.ShutdownGrace(middleware.ShutdownGraceConfig{Grace: 100 * time.Millisecond})
	require.NoError(t, err)
	_, err = middleware.ShutdownGrace(middleware.ShutdownGraceConfig{Grace: -time.Second})
	require.Error(t, err)

	orig, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	msg := newMsg()
	msg.SetContext(orig)
	var afterCancel, afterGrace error
	var cause error
	_, err = mw(func(m *message.Message) ([]*message.Message, error) {
		ctx := m.Context()
		require.Equal(t, "v", ctx.Value(ctxKey{}), "values are kept")
		cancel() // the router begins to close
		time.Sleep(20 * time.Millisecond)
		afterCancel = ctx.Err()
		<-ctx.Done()
		afterGrace, cause = ctx.Err(), context.Cause(ctx)
		return nil, nil
	})(msg)
	require.NoError(t, err)
	require.NoError(t, afterCancel, "the handler's context outlives the router's for the grace period")
	require.ErrorIs(t, afterGrace, context.Canceled)
	require.ErrorIs(t, cause, middleware.ErrShutdownGraceExpired)
	require.Equal(t, orig, msg.Context(), "the message's own context is restored")
}
