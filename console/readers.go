package console

import (
	"context"
	"errors"
	"time"
)

// ErrQueueBusy is a page's or an action's answer when another page, action
// or replay run of this console is reading the same poison queue for
// longer than Config.CallTimeout.
var ErrQueueBusy = errors.New("console: another page, action or replay run of this console is reading this poison queue; try again once it is done")

// summaryMaxAge is how long the groups page answers from its last scan of
// a poison queue while the queue holds as many messages (a scan reads and
// puts back every message: seconds per thousand); "read again" scans at
// once, and an action of this console drops it.
const summaryMaxAge = time.Minute

// runReadWait bounds how long a replay run waits for the queue before it
// gives up (ErrQueueBusy): it was started by an operator who watches it.
const runReadWait = 5 * time.Minute

// reading takes the poison queue for one reader of this console, waiting
// at most wait (and no longer than ctx): every read of a poison queue holds
// every message it read until it puts them back, so two readers at once
// would each see part of the queue (a page counting half of it) and, on a
// quorum queue, put back their parts interleaved — out of order. The
// returned func gives the queue back.
func (c *Console) reading(ctx context.Context, queue string, wait time.Duration) (func(), error) {
	c.mu.Lock()
	sem, ok := c.readers[queue]
	if !ok {
		sem = make(chan struct{}, 1)
		c.readers[queue] = sem
	}
	c.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-t.C:
		return nil, ErrQueueBusy
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// summary is a groups page's scan of a poison queue, kept to answer the
// next views while the queue holds as many messages and it is younger than
// summaryMaxAge: a scan reads and puts back every message (on
// RabbitMQ 3.10, 10,000 messages take about 20 s: docs/console.md).
type summary struct {
	at           time.Time
	groups       []*groupRow
	other, total int
}

// cached returns queue's summary when it is younger than
// summaryMaxAge and the queue's depth is still what it read.
func (c *Console) cached(queue string, depth int) (summary, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.summaries[queue]
	if !ok || time.Since(s.at) >= summaryMaxAge || s.total != depth {
		return summary{}, false
	}
	return s, true
}

// forget drops queue's summary: an action moved its messages.
func (c *Console) forget(queue string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.summaries, queue)
}
