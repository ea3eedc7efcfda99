package sluice_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
)

func TestRetryAfterIsATransientFailureThatSaysWhen(t *testing.T) {
	t.Parallel()
	cause := errors.New("429 Too Many Requests")
	err := sluice.RetryAfter(cause, 90*time.Second)
	require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))
	require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(err))
	require.ErrorIs(t, err, cause)
	d, ok := sluice.RetryAfterOf(err)
	require.True(t, ok)
	require.Equal(t, 90*time.Second, d)
	require.Equal(t, "transient: 429 Too Many Requests (retry after 1m30s)", err.Error())

	d, ok = sluice.RetryAfterOf(sluice.Transient(cause))
	require.False(t, ok)
	require.Zero(t, d)
	require.NoError(t, sluice.RetryAfter(nil, time.Second))
	d, _ = sluice.RetryAfterOf(sluice.RetryAfter(cause, -time.Second))
	require.Zero(t, d, "a negative wait is none")
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for value, want := range map[string]time.Duration{
		"120":                              2 * time.Minute,
		" 0 ":                              0,
		"Sat, 01 Mar 2025 12:05:00 GMT":    5 * time.Minute,
		"Saturday, 01-Mar-25 12:00:30 GMT": 30 * time.Second,
		"Sat Mar  1 12:01:00 2025":         time.Minute,
		"Sat, 01 Mar 2025 11:00:00 GMT":    0, // in the past
		"99999999999999999999":             24 * time.Hour,
		"Sun, 01 Mar 2026 12:00:00 GMT":    24 * time.Hour,
	} {
		got, ok := sluice.ParseRetryAfter(value, now)
		require.True(t, ok, value)
		require.Equal(t, want, got, value)
	}
	for _, value := range []string{"", "-5", "1.5", "soon", "\x1b[2J"} {
		_, ok := sluice.ParseRetryAfter(value, now)
		require.False(t, ok, "%q", value)
	}
}
