package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/amqpcall"
)

// confirmBuffer is how many confirms amqp091 may hand over before listen
// takes them.
const confirmBuffer = 4096

// confirmChannel is a channel in confirm mode whose confirms and
// basic.returns are matched to publishes by delivery tag.
//
// Each publish carries its delivery tag in publishIDHeader. RabbitMQ sends a
// mandatory message's basic.return before its basic.ack, and amqp091's reader
// hands the return over an unbuffered channel before it reads the ack. One
// goroutine (listen) takes both, so it always records a message's return
// before it sees that message's confirm: no further synchronisation needed.
type confirmChannel struct {
	ch       *amqp.Channel
	returns  chan amqp.Return
	confirms chan amqp.Confirmation
	closes   chan *amqp.Error
	settles  chan chan struct{} // settle's requests to listen
	done     chan struct{}      // closed when listen ends: the channel is closed
	closeErr error              // why the channel closed (the broker's reply), set before done closes
	refusal  bool               // the channel closed with a publish's channel exception (406, 403, 404), set before done closes
	frameMax int                // the connection's negotiated frame_max (0: unlimited)
	maxSize  int                // the broker's max_message_size (Connection.MaxMessageSize)

	pubMu sync.Mutex // serialises tag assignment and publishing

	nacked atomic.Bool // the broker nacked a publish: the Publisher retires c

	mu          sync.Mutex
	pending     map[uint64]*inflight
	lastSent    uint64 // the delivery tag of the last publish sent
	retired     bool   // close once pending is empty
	retireClose sync.Once
}

// inflight is one publish awaiting its confirm.
type inflight struct {
	c        *confirmChannel
	tag      uint64
	done     chan struct{}
	acked    bool
	closed   error // why the channel closed before the confirm, or nil
	refused  bool  // a publish's channel exception closed the channel, and f was the last sent (ErrRefused)
	returned *UnroutableError
	// unmatched is a basic.return that came while f was unconfirmed and
	// could not be matched to its publish: it may be f's.
	unmatched error
}

// newConfirmChannel opens a channel in confirm mode on conn, each wait for
// the broker given up when ctx ends or bound passes without its answer
// (amqpcall: conn is closed).
func newConfirmChannel(ctx context.Context, conn *amqp.Connection, bound time.Duration, maxSize int) (*confirmChannel, error) {
	ch, err := amqpcall.Do(ctx, conn, bound, "rabbitmq: opening a channel", conn.Channel)
	if err != nil {
		return nil, err
	}
	if err := amqpcall.Run(ctx, conn, bound, "rabbitmq: enabling publisher confirms", func() error { return ch.Confirm(false) }); err != nil {
		_ = ch.Close()
		return nil, err
	}
	c := &confirmChannel{
		ch:       ch,
		returns:  ch.NotifyReturn(make(chan amqp.Return)),
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, confirmBuffer)),
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		settles:  make(chan chan struct{}),
		done:     make(chan struct{}),
		pending:  make(map[uint64]*inflight),
		frameMax: conn.Config.FrameSize,
		maxSize:  maxSize,
	}
	go c.listen()
	return c, nil
}

func (c *confirmChannel) listen() {
	defer close(c.done)
	returns := c.returns
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			c.mu.Lock()
			c.returned(r)
			c.mu.Unlock()
		case reply := <-c.settles:
			// Take the confirms amqp091 has handed over already: a waiter
			// whose timeout passed must not call uncertain a publish the
			// broker confirmed (its return, if any, came before).
			stop := false
			for n := len(c.confirms); n > 0 && !stop; n-- {
				cf, ok := <-c.confirms
				stop = c.confirmed(cf, ok)
			}
			close(reply)
			if stop {
				return
			}
		case cf, ok := <-c.confirms:
			if c.confirmed(cf, ok) {
				return
			}
		}
	}
}

// confirmed records the confirm cf, or with !ok, that the channel closed
// (then it returns true: listen ends).
func (c *confirmChannel) confirmed(cf amqp.Confirmation, ok bool) bool {
	c.mu.Lock()
	if !ok { // the channel closed: no confirm will come
		// amqp091 sends the close reason before it closes the
		// confirms, so a broker's reply (404 NOT_FOUND for a missing
		// exchange, 406 ...) is in c.closes by now.
		c.closeErr = ErrChannelClosed
		refused := false
		select {
		case e, ok := <-c.closes:
			if ok && e != nil {
				c.closeErr = fmt.Errorf("%w: %w", ErrChannelClosed, e)
				// A channel exception answers a method on the channel —
				// here a publish, the culprit — and the broker discards
				// the publishes after it: the last publish sent is the
				// culprit or after it, not stored either way.
				refused = e.Server && (e.Code == amqp.PreconditionFailed || e.Code == amqp.AccessRefused || e.Code == amqp.NotFound)
			}
		default:
		}
		last := c.lastSent
		for tag := range c.pending {
			last = max(last, tag)
		}
		c.refusal = refused
		for tag, f := range c.pending {
			f.closed, f.refused = c.closeErr, refused && tag == last
			close(f.done)
			delete(c.pending, tag)
		}
		c.mu.Unlock()
		return true
	}
	if !cf.Ack {
		c.nacked.Store(true)
	}
	if f := c.pending[cf.DeliveryTag]; f != nil {
		f.acked = cf.Ack
		close(f.done)
		delete(c.pending, cf.DeliveryTag)
	}
	c.closeIfSettled()
	c.mu.Unlock()
	return false
}

// settle returns once listen has taken every confirm amqp091 handed over
// before the call, or the channel closed.
func (c *confirmChannel) settle() {
	reply := make(chan struct{})
	select {
	case c.settles <- reply:
		select {
		case <-reply:
		case <-c.done:
		}
	case <-c.done:
	}
}

// returned records the basic.return r on the publish it names by its
// publishIDHeader. A return that names none — its headers unparseable by
// the client (more than 8,192 entries: Headers is nil), or the header
// missing — could be the return of any publish still waiting for its
// confirm (a return comes before its message's confirm): each of them is
// then uncertain, never confirmed by the ack that follows. A return of a
// publish nobody waits for any more (forgotten) changes nothing. c.mu is
// held.
func (c *confirmChannel) returned(r amqp.Return) {
	ue := &UnroutableError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, ReplyCode: r.ReplyCode, ReplyText: r.ReplyText}
	id, found := r.Headers[publishIDHeader].(string)
	tag, err := strconv.ParseUint(id, 10, 64)
	if found && err == nil {
		if f := c.pending[tag]; f != nil {
			f.returned = ue
		}
		return
	}
	why := "its headers unreadable"
	if _, ok := headersReason(r.Headers); ok {
		why = "its headers unparseable by the client"
	}
	// Not %w of ue: a return is certain, this is not.
	unmatched := fmt.Errorf("%w: %w (%s): %v", sluice.ErrPublishUncertain, errUnmatchedReturn, why, ue) //nolint:errorlint // see above
	for _, f := range c.pending {
		f.unmatched = unmatched
	}
}

// publish publishes pub (mandatory) and returns what to wait on. A
// publishing whose content header does not fit in one frame, or that
// amqp091 cannot encode, a body over maxSize, a CC or BCC header that is
// not an array, is a *sluice.UnpublishableError and is not sent: the
// broker would close the connection or the channel, failing every publish
// in flight on it.
func (c *confirmChannel) publish(exchange, key string, pub amqp.Publishing) (*inflight, error) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	tag := c.ch.GetNextPublishSeqNo()
	f := &inflight{c: c, tag: tag, done: make(chan struct{})}
	pub.Headers[publishIDHeader] = strconv.FormatUint(tag, 10)
	if err := checkPublishing(pub, c.frameMax, c.maxSize); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.pending[tag] = f
	c.mu.Unlock()
	if err := c.ch.Publish(exchange, key, true, false, pub); err != nil {
		c.mu.Lock()
		delete(c.pending, tag)
		c.mu.Unlock()
		return nil, c.notSent(err)
	}
	c.mu.Lock()
	c.lastSent = max(c.lastSent, tag)
	c.mu.Unlock()
	return f, nil
}

// closedWait bounds how long a publish the client could not send waits for
// the channel's close reason, which amqp091 hands over as it shuts the
// channel down.
const closedWait = 5 * time.Second

// notSent is the error of a publish the client did not send (err): when
// the channel was closed by a publish's channel exception — an earlier
// message of the same call refused (406 over max_message_size, 403, 404)
// — it matches ErrRefused and ErrChannelClosed, as a publish sent after the
// culprit does: not stored, not uncertain. Before, a message that came
// after the culprit matched ErrRefused when the client sent it before the
// broker's close arrived and did not when the close came first (seen under
// load: "504 channel/connection is not open").
func (c *confirmChannel) notSent(err error) error {
	if !errors.Is(err, amqp.ErrClosed) {
		return err
	}
	select {
	case <-c.done:
	case <-time.After(closedWait):
		return err
	}
	c.mu.Lock()
	refusal, closeErr := c.refusal, c.closeErr
	c.mu.Unlock()
	if !refusal {
		return err
	}
	return fmt.Errorf("%w (not sent: %w): %w", ErrRefused, err, closeErr)
}

// errUnmatchedReturn is a basic.return that names no publish: every
// publish waiting for its confirm when it came is uncertain.
var errUnmatchedReturn = errors.New("rabbitmq: the broker returned a message of this channel that cannot be matched to its publish")

// errConfirmTimeout is a wait that outlasted PublisherConfig.ConfirmTimeout.
var errConfirmTimeout = fmt.Errorf("rabbitmq: no confirm within the confirm timeout: %w", context.DeadlineExceeded)

// alreadyExpired is a closed channel: the call's confirm timeout has passed.
var alreadyExpired = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

// wait waits for f's confirm until ctx ends or expired delivers. A wait
// that ends without the broker's answer — ctx done, the timeout, the
// channel closed — matches sluice.ErrPublishUncertain: the message was sent
// and may be stored. A nack or a return is certain: it is not.
func (f *inflight) wait(ctx context.Context, expired <-chan time.Time) error {
	var gaveUp error
	select {
	case <-f.done:
	case <-ctx.Done():
		gaveUp = fmt.Errorf("%w: waiting for the confirm: %w", sluice.ErrPublishUncertain, ctx.Err())
	case <-expired:
		gaveUp = fmt.Errorf("%w: %w", sluice.ErrPublishUncertain, errConfirmTimeout)
	}
	if gaveUp != nil {
		// A confirm already received, not yet taken, counts.
		f.c.settle()
		select {
		case <-f.done:
		default:
			f.forget()
			return gaveUp
		}
	}
	switch {
	case f.refused:
		return fmt.Errorf("%w: %w", ErrRefused, f.closed)
	case f.closed != nil:
		return fmt.Errorf("%w: %w", sluice.ErrPublishUncertain, f.closed)
	case !f.acked:
		return ErrNacked
	case f.returned != nil:
		return f.returned
	case f.unmatched != nil:
		return f.unmatched
	}
	return nil
}

// forget drops a publish nobody waits for any more; a confirm that still
// comes for it is ignored.
func (f *inflight) forget() {
	f.c.mu.Lock()
	delete(f.c.pending, f.tag)
	f.c.closeIfSettled()
	f.c.mu.Unlock()
}

// retire takes c out of use: the Publisher sends nothing more on it, and c
// closes once every publish sent on it has its answer or is forgotten —
// closing at once would turn their confirms into uncertain outcomes.
func (c *confirmChannel) retire() {
	c.mu.Lock()
	c.retired = true
	c.closeIfSettled()
	c.mu.Unlock()
}

// closeIfSettled closes a retired c whose publishes are all settled, in a
// goroutine: listen, a caller, must not wait for itself. c.mu is held.
func (c *confirmChannel) closeIfSettled() {
	if c.retired && len(c.pending) == 0 {
		c.retireClose.Do(func() { go c.close() })
	}
}

func (c *confirmChannel) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return c.ch.IsClosed()
	}
}

func (c *confirmChannel) close() {
	_ = c.ch.Close()
	<-c.done
}
