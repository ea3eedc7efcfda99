package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/diag"
)

// confirmTimeoutDefault bounds the wait for a publisher confirm.
const confirmTimeoutDefault = 30 * time.Second

// publishIDHeader is the AMQP header carrying the delivery tag by which the
// Publisher matches a basic.return to the message it publishes. The
// Marshaler drops it; consumers can ignore it.
const publishIDHeader = "sluice_publish_id"

var (
	// errPublisherClosed is returned by Publish after Close.
	errPublisherClosed = errors.New("rabbitmq: publisher closed")
	// ErrNacked is matched by a publish the broker refused (basic.nack).
	ErrNacked = errors.New("rabbitmq: broker nacked the message")
	// ErrChannelClosed is matched by a publish whose channel closed before the
	// broker confirmed it: it may or may not have been stored (the error
	// matches sluice.ErrPublishUncertain too).
	ErrChannelClosed = errors.New("rabbitmq: channel closed before the confirm")
	// ErrRefused is matched by a publish whose channel the broker closed
	// with a channel exception answering a publish — 406 PRECONDITION_FAILED
	// (a message over max_message_size), 403 ACCESS_REFUSED or 404
	// NOT_FOUND — when it was the last publish sent on that channel, or one
	// the client could not send any more because of that close: it is the
	// culprit or came after it, and the broker discards what follows a
	// channel exception, so the message is not stored (the error matches
	// ErrChannelClosed, not sluice.ErrPublishUncertain). The publishes
	// before it still awaiting their confirms may be stored: uncertain.
	ErrRefused = errors.New("rabbitmq: the broker refused the message by closing the channel (not stored)")
	// ErrBlocked is matched by a publish refused because the broker blocked
	// the connection (a memory or disk alarm) for longer than the publish
	// could wait.
	ErrBlocked = errors.New("rabbitmq: connection blocked by the broker")
)

// UnroutableError is a mandatory publish the broker returned (basic.return):
// no queue is bound for its routing key, although the broker then confirms it.
// Its text names what is missing — on the default exchange the queue of the
// routing key's name, on another exchange a binding for the routing key —
// and how to declare it.
type UnroutableError struct {
	Exchange, RoutingKey string
	ReplyCode            uint16
	ReplyText            string
}

func (e *UnroutableError) Error() string {
	head := fmt.Sprintf("rabbitmq: message returned as unroutable (%d %s)", e.ReplyCode, e.ReplyText)
	if e.Exchange == "" {
		return fmt.Sprintf("%s: exchange (default exchange), routing key %q: no queue named %q exists, and the default exchange routes a message "+
			"only to the queue its routing key names; declare it: `sluice topology apply --queue %s` (a Sluice consumer's queue, its tiers and "+
			"poison queue; rabbitmq.Topology.Declare in code) or a plain queue (`rabbitmqadmin declare queue name=%s durable=true`)",
			head, e.RoutingKey, e.RoutingKey, e.RoutingKey, e.RoutingKey)
	}
	return fmt.Sprintf("%s: exchange %q, routing key %q: nothing is bound to the exchange for this routing key; bind the queue that "+
		"should receive it (`rabbitmqadmin declare binding source=%s destination=QUEUE routing_key=%s`; declare a Sluice consumer's queue "+
		"first with `sluice topology apply --queue QUEUE`)", head, e.Exchange, e.RoutingKey, e.Exchange, e.RoutingKey)
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Connection is the broker's URL and the connection's options
	// (Connection.MeterProvider receives sluice.publish.confirm.duration and
	// sluice.publish.reconnects).
	Connection
	// Exchange every message is published to, with the topic as routing key.
	// Default "": the default exchange, where the topic is a queue name.
	Exchange string
	// Marshaler turns messages into publishings. Default Marshaler{}
	// (persistent, metadata as headers, compatible with watermill-amqp).
	Marshaler wamqp.Marshaler
	// ConfirmTimeout bounds the wait for a confirm when the message context
	// has no earlier deadline. Default 30 s.
	ConfirmTimeout time.Duration
}

// withDefaults validates cfg and returns a copy with its defaults filled.
func (cfg PublisherConfig) withDefaults() (PublisherConfig, error) {
	conn, err := cfg.Connection.withDefaults("PublisherConfig")
	if err != nil {
		return cfg, err
	}
	if err := broker.CheckName("PublisherConfig.Exchange", cfg.Exchange); err != nil {
		return cfg, err
	}
	if cfg.ConfirmTimeout < 0 {
		return cfg, fmt.Errorf("rabbitmq: PublisherConfig.ConfirmTimeout must not be negative, got %s", cfg.ConfirmTimeout)
	}
	return PublisherConfig{
		Connection:     conn,
		Exchange:       cfg.Exchange,
		Marshaler:      cmp.Or[wamqp.Marshaler](cfg.Marshaler, Marshaler{}),
		ConfirmTimeout: cmp.Or(cfg.ConfirmTimeout, confirmTimeoutDefault),
	}, nil
}

// Publisher is a message.Publisher with publisher confirms and mandatory
// routing. Publish returns nil only for messages the broker confirmed (ack)
// and did not return as unroutable. Messages of one call and of concurrent
// calls are pipelined on one channel: many confirms are in flight at once.
// After a broker restart or a closed channel it reconnects on the next
// Publish, and after a nack it publishes on a new channel. Each publish
// carries the header sluice_publish_id, by which a basic.return is matched
// to its message; the Marshaler drops it. It is safe for concurrent use.
type Publisher struct {
	cfg     PublisherConfig
	metrics meters

	mu      sync.Mutex
	conn    *amqp.Connection
	node    int // the index in cfg.URLs of conn's node, or of the next to try first
	ch      *confirmChannel
	closed  bool
	blocked *atomic.Pointer[amqp.Blocking] // conn's: non-nil while the broker blocks it
	dial    *dialing                       // the dial in progress, or nil

	life  context.Context // ends at Close: a dial in progress is given up
	stop  context.CancelFunc
	dials sync.WaitGroup // the dial in progress

	frameMax atomic.Int64 // the last channel's negotiated frame_max: CheckPublish's

	// partitionKey, set on a Broker's PartitionPublisher, is the header
	// every message must carry (checkPartition).
	partitionKey string
}

var (
	_ message.Publisher     = (*Publisher)(nil)
	_ broker.EachPublisher  = (*Publisher)(nil)
	_ broker.PublishChecker = (*Publisher)(nil)
)

// clientFrameMax is the frame_max the client asks for (amqp091's default,
// RabbitMQ's): the negotiated one is at most this.
const clientFrameMax = 131072

// NewPublisher validates cfg and returns a Publisher; it connects on the
// first Publish.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	pm, err := newPublisherMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg}
	p.life, p.stop = context.WithCancel(context.Background())
	p.frameMax.Store(clientFrameMax)
	p.metrics.own = cfg.MeterProvider != nil
	p.metrics.current.Store(pm)
	return p, nil
}

// Publish publishes msgs to the topic (the routing key) and waits for each
// one's confirm, bounded by its context and ConfirmTimeout. Not connected,
// it waits for the connection until every message's context has ended (a
// dial runs outside the publisher's lock, one at a time, each node bounded
// by DialTimeout; concurrent calls wait for the same one): a broker that
// does not answer holds no call past its context, and the error then
// matches sluice.Unreachable. A confirm received by the time a wait gives
// up counts. It returns an
// error naming every message that was not confirmed, nacked, returned as
// unroutable, or whose channel closed first. A message sent whose confirm
// did not come — the confirm timeout, its context ended, the channel or
// connection closed first — may be stored: its error matches
// sluice.ErrPublishUncertain; so does one confirmed after a basic.return
// the client could not match to its publish (a return whose headers it
// cannot parse: more than 8,192 entries), which may be its own. A nack, a return, or a message never sent
// (blocked, unpublishable, a closed channel at send) is certain: not stored.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := p.checkPartition(topic, m); err != nil {
			return fmt.Errorf("message %s: %w", diag.Bound(m.UUID, 64), err)
		}
	}
	errs, whole := p.publish(topic, msgs)
	if whole != nil {
		return whole
	}
	return errors.Join(errs...)
}

// PublishEach is Publish reporting each message's outcome: its result has
// one error per message, in order, nil for each one confirmed (the outbox's
// relay reads it, broker.EachPublisher). The messages are sent in order on
// one channel, their confirms awaited together.
func (p *Publisher) PublishEach(topic string, msgs ...*message.Message) []error {
	if p.partitionKey != "" {
		return p.publishPartitioned(topic, msgs)
	}
	return p.publishEach(topic, msgs)
}

func (p *Publisher) publishEach(topic string, msgs []*message.Message) []error {
	errs, whole := p.publish(topic, msgs)
	if whole != nil {
		for i := range errs {
			errs[i] = whole
		}
	}
	return errs
}

// publish publishes msgs: one error per message, or whole, an error
// before any was sent that is every message's.
func (p *Publisher) publish(topic string, msgs []*message.Message) (errs []error, whole error) {
	errs = make([]error, len(msgs))
	if err := broker.CheckName("routing key", topic); err != nil {
		return errs, err
	}
	ctx, stop := callContext(msgs)
	ch, blocked, err := p.channel(ctx)
	stop()
	if err != nil {
		return errs, err
	}
	if b := blocked.Load(); b != nil {
		return errs, fmt.Errorf("%w (%s): %d messages to %q not published", ErrBlocked, b.Reason, len(msgs), topic)
	}
	type published struct {
		i int
		f *inflight
	}
	pending := make([]published, 0, len(msgs))
	start := time.Now()
	for i, msg := range msgs {
		if err := msg.Context().Err(); err != nil {
			errs[i] = fmt.Errorf("rabbitmq: message %s not published: %w", msg.UUID, err)
			continue
		}
		pub, err := p.cfg.Marshaler.Marshal(msg)
		if err != nil {
			errs[i] = fmt.Errorf("rabbitmq: marshaling message %s: %w", msg.UUID, err)
			continue
		}
		if pub.Headers == nil {
			pub.Headers = amqp.Table{}
		}
		f, err := ch.publish(p.cfg.Exchange, topic, pub)
		if err != nil {
			errs[i] = fmt.Errorf("rabbitmq: publishing message %s to %q: %w", msg.UUID, topic, err)
			continue
		}
		pending = append(pending, published{i, f})
	}
	// One timer bounds the whole call; each message's context bounds its own wait.
	timer := time.NewTimer(p.cfg.ConfirmTimeout)
	defer timer.Stop()
	expired := timer.C
	for _, pm := range pending {
		msg := msgs[pm.i]
		err := pm.f.wait(msg.Context(), expired)
		if errors.Is(err, errConfirmTimeout) {
			expired = alreadyExpired
		}
		p.metrics.confirmed(msg.Context(), time.Since(start).Seconds(), topic, confirmOutcome(err))
		if err != nil {
			errs[pm.i] = fmt.Errorf("rabbitmq: message %s to %q: %w", msg.UUID, topic, err)
		}
	}
	return errs, nil
}

// channel returns the live confirm channel and its connection's blocked
// state, connecting when needed. The dial, and the channel's opening, run
// outside p.mu, one at a time (every caller waits for the same), so a
// broker that does not answer holds no caller past its ctx: a caller whose
// ctx ends gets an error matching sluice.Unreachable, and the dial or the
// opening goes on for the next.
func (p *Publisher) channel(ctx context.Context) (*confirmChannel, *atomic.Pointer[amqp.Blocking], error) {
	for {
		p.mu.Lock()
		ch, d, err := p.channelLocked()
		p.mu.Unlock()
		if ch != nil || err != nil {
			return ch, p.blockedState(), err
		}
		select {
		case <-d.done:
			if d.err != nil {
				return nil, nil, d.err
			}
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("rabbitmq: not connected to the broker before the message's context ended (a dial or a channel's opening in progress): %w",
				&net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()})
		}
	}
}

func (p *Publisher) blockedState() *atomic.Pointer[amqp.Blocking] {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked
}

// dialing is a dial, or a channel's opening, in progress: done closes when
// it ended, err its error.
type dialing struct {
	done chan struct{}
	err  error
}

// channelLocked returns the live confirm channel, or the dial or channel
// opening in progress to wait for (starting one). p.mu is held.
func (p *Publisher) channelLocked() (*confirmChannel, *dialing, error) {
	if p.closed {
		return nil, nil, errPublisherClosed
	}
	if p.ch != nil && !p.ch.isClosed() && !p.ch.nacked.Load() {
		return p.ch, nil, nil
	}
	if p.ch != nil {
		scope := "channel"
		switch {
		case p.conn == nil || p.conn.IsClosed():
			scope = "connection"
		case !p.ch.isClosed():
			// The broker nacked a publish on this channel. RabbitMQ 3.10
			// can then nack every later publish on it (a quorum queue
			// after a leader change) while a new channel's are confirmed:
			// publish on a new one, and close this one once its confirms
			// are in.
			scope = "nacked"
		}
		p.metrics.reconnected(scope)
		p.cfg.Logger.Info("Reconnecting the confirmed publisher", watermill.LogFields{"url": diag.RedactURL(p.cfg.URLs[p.node]), "closed": scope})
		if scope == "nacked" {
			p.ch.retire()
		} else {
			p.ch.close()
		}
		p.ch = nil
	}
	if p.conn != nil && p.conn.IsClosed() {
		p.conn = nil
		p.node = (p.node + 1) % len(p.cfg.URLs) // its node failed: the others first
	}
	if p.conn == nil {
		if p.dial == nil {
			p.dial = &dialing{done: make(chan struct{})}
			p.dials.Add(1)
			go p.connect(p.dial, p.node)
		}
		return nil, p.dial, nil
	}
	if p.dial == nil { // the channel is opened outside p.mu, as the dial is
		p.dial = &dialing{done: make(chan struct{})}
		p.dials.Add(1)
		go p.open(p.dial, p.conn)
	}
	return nil, p.dial, nil
}

// open opens a confirm channel on conn for d, outside p.mu, and makes it
// p's: a broker whose channels answer nothing holds it up to WriteTimeout
// (then conn is closed), and no caller past its ctx; Close ends it early.
func (p *Publisher) open(d *dialing, conn *amqp.Connection) {
	defer p.dials.Done()
	ch, err := newConfirmChannel(p.life, conn, p.cfg.WriteTimeout, p.cfg.MaxMessageSize)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dial = nil
	switch {
	case err != nil:
		if p.conn == conn {
			_ = closeConn(conn, p.cfg.WriteTimeout)
			p.conn = nil
			p.node = (p.node + 1) % len(p.cfg.URLs)
		}
	case p.closed || p.conn != conn:
		ch.close()
		err = errPublisherClosed
	default:
		p.ch = ch
		p.frameMax.Store(int64(ch.frameMax))
	}
	d.err = err
	close(d.done)
}

// connect dials the broker from node for d, outside p.mu, and makes the
// connection p's; Close ends it early.
func (p *Publisher) connect(d *dialing, node int) {
	defer p.dials.Done()
	conn, node, err := p.cfg.dialContext(p.life, "sluice publisher", node)
	p.mu.Lock()
	p.dial = nil
	if err == nil && p.closed {
		defer func() { _ = closeConn(conn, p.cfg.WriteTimeout) }()
		err = errPublisherClosed
	}
	if err == nil {
		p.conn, p.node = conn, node
		blocked := new(atomic.Pointer[amqp.Blocking])
		p.blocked = blocked
		blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
		go func() { // ends when conn closes: amqp091 closes blocks then
			for b := range blocks {
				if b.Active {
					blocked.Store(&b)
					p.cfg.Logger.Info("The broker blocked the publisher's connection", watermill.LogFields{"reason": b.Reason})
				} else {
					blocked.Store(nil)
				}
			}
		}()
	}
	d.err = err
	close(d.done)
	p.mu.Unlock()
}

// callContext returns a context that ends once the context of every one
// of msgs has ended: how long a call waits for a connection.
func callContext(msgs []*message.Message) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	if len(msgs) == 0 {
		return ctx, cancel
	}
	var left atomic.Int64
	left.Store(int64(len(msgs)))
	stops := make([]func() bool, len(msgs))
	for i, m := range msgs {
		stops[i] = context.AfterFunc(m.Context(), func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}

// Close closes the connection, and with it the channel, waiting at most
// WriteTimeout for the broker's answer (the connection is closed either
// way; the error then says the broker did not answer). It is idempotent;
// Publish fails afterwards.
func (p *Publisher) Close() error {
	// Before the lock: a dial in progress ends at once, and so does a
	// channel's opening that holds the lock (newConfirmChannel).
	p.stop()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var err error
	if p.conn != nil && !p.conn.IsClosed() {
		err = closeConn(p.conn, p.cfg.WriteTimeout)
	}
	if p.ch != nil {
		p.ch.close() // returns at once on a closed connection
	}
	p.mu.Unlock()
	p.dials.Wait()
	return err
}

func confirmOutcome(err error) string {
	var ue *UnroutableError
	switch {
	case err == nil:
		return "acked"
	case errors.As(err, &ue):
		return "returned"
	case errors.Is(err, ErrNacked):
		return "nacked"
	case errors.Is(err, errUnmatchedReturn):
		return "returned_unmatched"
	case errors.Is(err, ErrChannelClosed):
		return "closed"
	case errors.Is(err, ErrBlocked):
		return "blocked"
	default:
		return "timeout"
	}
}
