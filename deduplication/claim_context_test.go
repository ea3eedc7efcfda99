package deduplication

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestClaimContext(t *testing.T) {
	t.Parallel()
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")

	before := time.Now()
	c := newClaimContext(parent, 30*time.Millisecond)
	after := time.Now()
	live := newClaimContext(parent, time.Hour)
	require.NoError(t, live.Err(), "live until the deadline")
	live.release()
	require.Equal(t, "v", c.Value(key{}), "the parent's values")
	d, ok := c.Deadline()
	require.True(t, ok)
	// Bounded by the clock read around the call, not by a tolerance a busy
	// machine can exceed.
	require.False(t, d.Before(before.Add(30*time.Millisecond)), "deadline %s", d)
	require.False(t, d.After(after.Add(30*time.Millisecond)), "deadline %s", d)
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done never closed at the deadline")
	}
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	c.release()

	// The parent ends first: the claim ends with it.
	p, cancel := context.WithCancel(parent)
	c = newClaimContext(p, time.Hour)
	done := c.Done()
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Done never closed with the parent")
	}
	require.ErrorIs(t, c.Err(), context.Canceled)
	c.release()

	// An expired deadline without anyone waiting: Err reports it, and Done
	// is then closed.
	c = newClaimContext(parent, time.Nanosecond)
	time.Sleep(time.Millisecond)
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	<-c.Done()

	// Released before anyone waited: no timer was armed; Done is closed.
	c = newClaimContext(parent, time.Hour)
	c.release()
	require.True(t, errors.Is(c.Err(), context.Canceled))
	<-c.Done()

	// A parent deadline earlier than the claim's is the deadline.
	early, cancelEarly := context.WithTimeout(parent, time.Millisecond)
	defer cancelEarly()
	c = newClaimContext(early, time.Hour)
	d, _ = c.Deadline()
	pd, _ := early.Deadline()
	require.Equal(t, pd, d)
	<-c.Done()
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	c.release()
}
