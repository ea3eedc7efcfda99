package deduplication

import (
	"context"
	"sync"
	"time"
)

// claimContext is a context with a deadline that arms its timer only when
// something waits on Done. An uncontended claim on a store that does not
// wait (the memory store) never does, so the claim timeout costs one small
// allocation instead of a timer, a cancel context and a registration with
// the parent; a store that watches the context (database/sql drivers) arms
// it and gets the same behaviour as context.WithTimeout.
type claimContext struct {
	context.Context // the parent: values, and its own end

	deadline time.Time

	mu      sync.Mutex
	done    chan struct{}
	err     error
	timer   *time.Timer
	stopOrg func() bool
}

func newClaimContext(parent context.Context, timeout time.Duration) *claimContext {
	return &claimContext{Context: parent, deadline: time.Now().Add(timeout)}
}

// Deadline is the earlier of the parent's deadline and the claim's.
func (c *claimContext) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Done arms the claim's timer and a watch on the parent on its first call.
func (c *claimContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if err := c.endedLocked(); err != nil { // ended before anyone waited
		c.err = err
		close(c.done)
		return c.done
	}
	c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
	c.stopOrg = context.AfterFunc(c.Context, func() { c.end(c.Context.Err()) })
	return c.done
}

// Err is nil until the claim's deadline passes or the parent ends.
func (c *claimContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.endedLocked(); err != nil {
		c.endLocked(err)
	}
	return c.err
}

// endedLocked reports why the context has ended, if it has.
func (c *claimContext) endedLocked() error {
	switch {
	case c.err != nil:
		return c.err
	case c.Context.Err() != nil:
		return c.Context.Err()
	case !time.Now().Before(c.deadline):
		return context.DeadlineExceeded
	}
	return nil
}

func (c *claimContext) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endLocked(err)
}

func (c *claimContext) endLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}

// release stops the timer and the watch on the parent; the context ends
// (Canceled) if it has not already.
func (c *claimContext) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.stopOrg()
	}
	c.endLocked(context.Canceled)
}
