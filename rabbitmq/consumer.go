package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/settle"
)

// Consumer's defaults.
const (
	// drainTimeoutDefault is how long Close waits for the deliveries in
	// flight to be acked or nacked before it closes their channel and
	// cancels their contexts. It is what Watermill users expect of a
	// subscriber's Close, and what a shutdown needs, no more:
	//   - a router's ShutdownGrace stage (router.Stages.ShutdownGrace,
	//     router.Stages.ShutdownGrace's default, 10 s) lets a handler in flight
	//     commit for 10 s once the router closes; the drain outlasts it by
	//     2 s, so that the ack of a handler committing at the end of its
	//     grace still reaches the broker (its delivery is not redelivered);
	//   - a handler still at work after that is cut short anyway, and its
	//     delivery goes back to the queue either way: waiting longer only
	//     delays Close. Watermill's universal Pub/Sub suite wants an
	//     unacked message's context cancelled within 15 s of Close
	//     (TestMessageCtx, which a 30 s drain failed), and an
	//     orchestrator's stop (Kubernetes waits 30 s by default before it
	//     kills the process) must leave time for the router, the relay and
	//     the rest after the drain.
	//
	// Raise ConsumerConfig.DrainTimeout together with a longer ShutdownGrace.
	drainTimeoutDefault = 12 * time.Second
	// queueCallTimeoutDefault bounds the wait for the broker's answer to a
	// basic.consume or basic.cancel, which on a quorum queue waits for a
	// Raft command of the queue's: RabbitMQ gives those 30 s, or
	// net_ticktime + 5 s (65 s by default) while a leader is elected
	// (rabbit_fifo_client); a shorter bound would close a connection that
	// is slow, not silent.
	queueCallTimeoutDefault = 70 * time.Second
	reconnectBackoffDefault = time.Second
	reconnectBackoffMax     = 30 * time.Second
)

// errConsumerClosed is returned by Subscribe after Close.
var errConsumerClosed = errors.New("rabbitmq: consumer closed")

// ConsumerConfig configures NewConsumer.
type ConsumerConfig struct {
	// Connection is the broker's URL and the connection's options; the
	// Consumer records no metrics of its own (Connection.MeterProvider).
	Connection
	// Prefetch is how many deliveries a subscription has in flight at once,
	// each handled by its own router goroutine and acked by its own
	// delivery tag, in any order. Default 16.
	Prefetch int
	// DrainTimeout bounds Close's wait for the deliveries in flight to be
	// acked or nacked. Default 12 s (a router's
	// default ShutdownGrace of 10 s, and 2 s for the last acks); keep it
	// above the ShutdownGrace you set.
	DrainTimeout time.Duration
	// reconnectBackoff is the first wait before reconnecting after the
	// connection or channel closed (1 s; the tests' own is shorter): it
	// doubles up to 30 s while the reconnections fail, and starts again
	// from reconnectBackoff after a connection that got as far as
	// consuming.
	reconnectBackoff time.Duration
	// queueCallTimeout bounds the wait for a basic.consume's or a
	// basic.cancel's answer (70 s; the tests' own is shorter).
	queueCallTimeout time.Duration
	// Marshaler reads deliveries. Default Marshaler{}.
	Marshaler wamqp.Marshaler
	// PoisonQueue and PoisonPublisher (a confirmed publisher), set
	// together, isolate a delivery whose headers the AMQP client refuses to
	// parse (sluice_amqp_headers_error): a copy of its body and properties
	// with the poison diagnosis — class poison, the reason naming the header
	// and the limit — is published to PoisonQueue and the delivery acked; no
	// handler runs. NewBroker sets both. Without them such a delivery is
	// handed to the handler, its headers dropped and
	// sluice_amqp_headers_error set.
	PoisonQueue     string
	PoisonPublisher message.Publisher
}

// withDefaults validates cfg and returns a copy with its defaults filled.
func (cfg ConsumerConfig) withDefaults() (ConsumerConfig, error) {
	conn, err := cfg.Connection.withDefaults("ConsumerConfig")
	if err != nil {
		return cfg, err
	}
	switch {
	case cfg.Prefetch < 0:
		return cfg, fmt.Errorf("rabbitmq: ConsumerConfig.Prefetch must be positive, got %d", cfg.Prefetch)
	case cfg.DrainTimeout < 0:
		return cfg, fmt.Errorf("rabbitmq: ConsumerConfig.DrainTimeout must be positive, got %s", cfg.DrainTimeout)
	case (cfg.PoisonQueue == "") != (cfg.PoisonPublisher == nil):
		return cfg, errNoPoisonQueue
	}
	if err := broker.CheckName("ConsumerConfig.PoisonQueue", cfg.PoisonQueue); err != nil {
		return cfg, err
	}
	return ConsumerConfig{
		Connection:       conn,
		Prefetch:         cmp.Or(cfg.Prefetch, prefetchDefault),
		DrainTimeout:     cmp.Or(cfg.DrainTimeout, drainTimeoutDefault),
		reconnectBackoff: cmp.Or(cfg.reconnectBackoff, reconnectBackoffDefault),
		queueCallTimeout: cmp.Or(cfg.queueCallTimeout, queueCallTimeoutDefault),
		Marshaler:        cmp.Or[wamqp.Marshaler](cfg.Marshaler, Marshaler{}),
		PoisonQueue:      cfg.PoisonQueue,
		PoisonPublisher:  cfg.PoisonPublisher,
	}, nil
}

// Consumer is Sluice's RabbitMQ message.Subscriber. Unlike watermill-amqp's,
// which waits for each delivery's ack before it reads the next, a
// subscription keeps up to Prefetch deliveries in flight: the router handles
// each in its own goroutine and the Consumer acks or nacks (with requeue) each
// by its delivery tag as its handler finishes, in any order. A slow retry
// publish no longer holds the next messages back.
//
// Close drains: it cancels the consumers (basic.cancel: no new deliveries),
// waits up to DrainTimeout for the deliveries in flight to be acked or
// nacked, then closes the channels — deliveries prefetched but never handed
// to a handler go back to the queue unprocessed, never handled twice. The
// router calls Close when it closes, so a deploy no longer turns the work
// in flight into redeliveries. A subscription reconnects, with backoff,
// after a broker restart or a closed channel. Safe for concurrent use.
type Consumer struct {
	cfg ConsumerConfig

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	subs    sync.WaitGroup
	live    map[*subscription]struct{} // the subscriptions running
	// consuming, set by NewBroker before the first Subscribe, is called
	// each time a subscription starts consuming: the Broker's depth
	// poller reads the queues again, so sluice.queue.consumers does not
	// read 0 until its next interval.
	consuming func()
}

var _ broker.GatedSubscriber = (*Consumer)(nil)

// NewConsumer validates cfg and returns a Consumer; it connects on Subscribe.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, closing: make(chan struct{}), live: map[*subscription]struct{}{}}, nil
}

// Connected reports whether the Consumer consumes: it has a subscription,
// and each of its subscriptions holds a connection to the broker and
// consumes its queue — or has stopped consuming because its brake is
// engaged (the brake reports that itself). A subscription reconnecting after
// a broker restart, a closed channel or a failed dial is not connected.
// service.Service's readiness report reads it.
func (c *Consumer) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.live) == 0 {
		return false
	}
	for s := range c.live {
		if engaged, _, _ := s.gateState(); !engaged && !s.consuming.Load() {
			return false
		}
	}
	return true
}

// Subscribe consumes the queue named topic (declared beforehand: Topology).
// A queue the broker says does not exist fails Subscribe (ErrQueueNotFound,
// naming it); Subscribe waits for that answer, at most DialTimeout per node
// and WriteTimeout, and a broker it cannot reach is left to the
// subscription, which reconnects. The channel closes once the subscription
// has drained, after ctx ends or Close.
func (c *Consumer) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return c.subscribe(ctx, topic, nil)
}

// WithGate returns a view of c whose subscriptions stop consuming while g is
// engaged (the brake): they cancel their consumer, drain the deliveries in
// flight (held back, so nacked), close their connection — the broker then
// shows no consumer — and consume again when g is released or probing.
// Closing the view closes c. router.Add calls it with the handler's brake.
func (c *Consumer) WithGate(g broker.Gate) message.Subscriber {
	return gatedConsumer{c, g}
}

type gatedConsumer struct {
	c *Consumer
	g broker.Gate
}

func (v gatedConsumer) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return v.c.subscribe(ctx, topic, v.g)
}

func (v gatedConsumer) Close() error { return v.c.Close() }

func (c *Consumer) subscribe(ctx context.Context, topic string, gate broker.Gate) (<-chan *message.Message, error) {
	if err := broker.CheckName("queue", topic); err != nil {
		return nil, err
	}
	if err := c.checkQueue(topic); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errConsumerClosed
	}
	out := make(chan *message.Message)
	s := &subscription{c: c, queue: topic, out: out, gate: gate}
	c.subs.Add(1)
	c.live[s] = struct{}{}
	go func() {
		defer c.subs.Done()
		defer func() {
			c.mu.Lock()
			delete(c.live, s)
			c.mu.Unlock()
		}()
		s.run(ctx)
	}()
	return out, nil
}

// Close stops every subscription, draining the deliveries in flight (see
// Consumer), and waits for them. It is idempotent.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.closing)
	}
	c.mu.Unlock()
	c.subs.Wait()
	return nil
}

// subscription is one Subscribe: a connection and channel of its own.
type subscription struct {
	c     *Consumer
	queue string
	out   chan *message.Message
	gate  broker.Gate // nil: never stops consuming
	node  int         // the index in URLs of the node to try first
	// consumed is set once a connection got as far as consuming: its
	// failure starts the backoff again from reconnectBackoff.
	consumed bool
	// consuming is true while a connection consumes (Consumer.Connected).
	consuming atomic.Bool
}

// errBraked ends a consume loop whose gate engaged, after draining.
var errBraked = errors.New("rabbitmq: the brake is engaged")

// gateState reads the gate: engaged, probing (a broker.ProbingGate letting
// one delivery through), and a channel closed at the next change (nil, which
// never fires, without a gate).
func (s *subscription) gateState() (engaged, probing bool, changed <-chan struct{}) {
	if s.gate == nil {
		return false, false, nil
	}
	engaged, changed = s.gate.Engaged()
	if pg, ok := s.gate.(broker.ProbingGate); ok {
		probing = pg.Probing()
	}
	return engaged, probing, changed
}

// prefetch is how many deliveries to take at once: one while the gate
// probes, so a failed probe returns one delivery and not every delivery
// prefetched beside it.
func (s *subscription) prefetch(probing bool) int {
	if probing {
		return 1
	}
	return s.c.cfg.Prefetch
}

func (s *subscription) run(ctx context.Context) {
	defer close(s.out)
	stop := make(chan struct{})
	// life ends with stop: a dial in progress — a broker that accepts the
	// connection and never answers holds it for DialTimeout — is given up
	// at once, so Close does not wait for it.
	life, end := context.WithCancel(context.Background())
	defer end()
	go func() { // ctx or Close: either ends the subscription
		select {
		case <-ctx.Done():
		case <-s.c.closing:
		}
		close(stop)
		end()
	}()
	backoff := s.c.cfg.reconnectBackoff
	for {
		if engaged, _, changed := s.gateState(); engaged {
			select {
			case <-stop:
				return
			case <-changed:
				continue
			}
		}
		err := s.consume(ctx, life, stop)
		select {
		case <-stop:
			return
		default:
		}
		if errors.Is(err, errBraked) {
			s.c.cfg.Logger.Info("Consuming stopped by the brake", watermill.LogFields{"queue": s.queue})
			backoff = s.c.cfg.reconnectBackoff
			continue
		}
		if s.consumed { // a connection that worked: not the same failure again
			backoff, s.consumed = s.c.cfg.reconnectBackoff, false
		}
		s.c.cfg.Logger.Error("Consuming stopped; reconnecting after a backoff", err,
			watermill.LogFields{"queue": s.queue, "backoff": backoff.String()})
		s.node = (s.node + 1) % len(s.c.cfg.URLs) // the others first
		select {
		case <-stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, reconnectBackoffMax)
	}
}

// consume runs one connection until it fails (the error) or stop closes (nil,
// after draining); its dial is given up when life ends.
func (s *subscription) consume(ctx, life context.Context, stop <-chan struct{}) error {
	conn, node, err := s.c.cfg.dialContext(life, "sluice consumer "+s.queue, s.node)
	if err != nil {
		return err
	}
	s.node = node
	defer func() { _ = closeConn(conn, s.c.cfg.WriteTimeout) }()
	// The channel's opening and its prefetch wait for the broker at most
	// WriteTimeout each, and Close ends them at once; the consume waits
	// up to queueCallTimeout (startConsuming). A broker whose heartbeats
	// keep the connection alive while its channels answer nothing (a stuck
	// channel process) held them for ever, and Close too.
	ch, err := amqpcall.Do(life, conn, s.c.cfg.WriteTimeout, "rabbitmq: opening a channel", conn.Channel)
	if err != nil {
		return err
	}
	engaged, probing, changed := s.gateState()
	if engaged { // engaged while this connection was being set up: take nothing
		return errors.Join(errBraked, closeWithin(conn, s.c.cfg.WriteTimeout, ch.Close))
	}
	cur, err := s.startConsuming(life, conn, ch, s.prefetch(probing))
	if err != nil {
		return err
	}
	s.consumed = true
	s.consuming.Store(true)
	defer s.consuming.Store(false)
	defer func() { cur.stopped() }()
	var inflight sync.WaitGroup
	// flight is the deliveries' context: it ends when this connection's work
	// does — the channel gone, or the drain over (in time or not) — so a
	// handler still at work on a delivery the broker will redeliver
	// elsewhere is cancelled instead of going on beside its redelivery.
	flight, cancelFlight := context.WithCancel(ctx)
	over := make(chan struct{}) // closed with flight: no ack can be sent any more
	var overOnce sync.Once
	endFlight := func() { overOnce.Do(func() { close(over); cancelFlight() }) }
	defer endFlight()
	failed := func(err error) error { // the channel is gone: nothing to drain
		cur.stopped()
		endFlight()
		inflight.Wait() // their acks fail on the closed channel: redelivered
		return err
	}
	widening := false // the probe's consumer is cancelled; a full prefetch follows
	for {
		select {
		case <-stop:
			return s.drain(conn, ch, cur, &inflight)
		case <-changed:
			engaged, probing, changed = s.gateState()
			switch {
			case engaged:
				return errors.Join(errBraked, s.drain(conn, ch, cur, &inflight))
			case !widening && s.prefetch(probing) > cur.prefetch:
				// Released after a probe. A consumer's prefetch cannot
				// change: cancel it (the deliveries it still holds arrive
				// below and are handled) and consume anew, on this channel,
				// once its deliveries end.
				// Not given up at Close (Background): a cancel answered goes
				// on to Close's drain of the deliveries in flight.
				err := amqpcall.Run(context.Background(), conn, s.c.cfg.queueCallTimeout, "rabbitmq: cancelling the probe's consumer",
					func() error { return ch.Cancel(cur.tag, false) })
				if err != nil {
					return failed(err)
				}
				cur.stopped()
				widening = true
			}
		case d, ok := <-cur.deliveries:
			switch {
			case !ok && widening && closingNow(stop, s.c.closing):
				return s.drain(conn, ch, cur, &inflight) // no full prefetch for a Consumer closing
			case !ok && widening:
				widening = false
				next, err := s.startConsuming(context.Background(), conn, ch, s.prefetch(probing))
				if err != nil {
					return failed(err)
				}
				cur = next
			case !ok:
				return failed(errors.New("rabbitmq: the deliveries channel closed (consumer cancelled or channel closed)"))
			case !s.handOut(flight, over, d, cur, stop, &inflight):
				return s.drain(conn, ch, cur, &inflight, d)
			}
		}
	}
}

// consumer is one basic.consume of a subscription's channel.
type consumer struct {
	tag        string
	prefetch   int
	deliveries <-chan amqp.Delivery
	done       chan struct{} // closed once the consumer is cancelled
	once       sync.Once
}

// stopped records that the consumer takes no more deliveries.
func (c *consumer) stopped() { c.once.Do(func() { close(c.done) }) }

// startConsuming sets the prefetch and consumes the queue under a new tag;
// conn is closed under a call the broker does not answer (amqpcall): the
// prefetch within WriteTimeout, or when ctx ends; the consume within
// queueCallTimeout, and not when ctx ends — a consume given up after the
// broker took it would have its first deliveries returned by the
// connection's close, each a delivery on a quorum queue's count.
func (s *subscription) startConsuming(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel, prefetch int) (*consumer, error) {
	if err := amqpcall.Run(ctx, conn, s.c.cfg.WriteTimeout, "rabbitmq: setting the prefetch", func() error { return ch.Qos(prefetch, 0, false) }); err != nil {
		return nil, err
	}
	c := &consumer{tag: "sluice-" + watermill.NewShortUUID(), prefetch: prefetch, done: make(chan struct{})}
	deliveries, err := amqpcall.Do(context.Background(), conn, s.c.cfg.queueCallTimeout, "rabbitmq: consuming "+diag.Printable(s.queue, 255), func() (<-chan amqp.Delivery, error) {
		return ch.Consume(s.queue, c.tag, false, false, false, false, nil)
	})
	if err != nil {
		return nil, err
	}
	c.deliveries = deliveries
	if s.c.consuming != nil {
		s.c.consuming() // the broker's consumers gauge reads the consumer now
	}
	return c, nil
}

// handOut gives d to the router and acks or nacks it by its tag when its
// handler ends; false when stop closed before a handler took it: d is the
// drain's to give back, unprocessed, after those in flight.
//
// Settlements wait for c to be cancelled where a consumer with credit
// would be handed a delivery it cannot keep — the broker returns it, and
// on a quorum queue each return counts toward x-delivery-limit and comes
// back ahead of the rest: a delivery nacked while the gate is engaged or
// the Consumer closes (held by the brake, or given back by an ordered
// handler's view while the router closes: nacked before the cancel it
// would come straight back, to be returned again), an ack once the
// Consumer closes (a quorum queue sends the consumer the next message for
// the credit, and once the cancel is through returns it ahead of the
// deliveries the closing Consumer gives back: it would overtake a key's
// waiting deliveries), and the ack of a probe consumer's delivery once the
// gate released (its ack would give the consumer about to be cancelled
// credit for one more).
func (s *subscription) handOut(ctx context.Context, over <-chan struct{}, d amqp.Delivery, c *consumer, stop <-chan struct{}, inflight *sync.WaitGroup) bool {
	msg, err := readDelivery(s.c.cfg.Marshaler, d)
	if err != nil {
		s.c.cfg.Logger.Error("Delivery not readable; requeued", diag.RedactError(err), watermill.LogFields{"queue": s.queue})
		_ = d.Nack(false, true)
		return true
	}
	if msg.Metadata.Get(metakeys.HeadersError) != "" && s.c.cfg.PoisonQueue != "" {
		inflight.Add(1)
		go func() { defer inflight.Done(); s.isolate(ctx, d, msg) }()
		return true
	}
	msgCtx, cancel := context.WithCancel(ctx)
	sent := make(chan struct{}) // closed once the ack or nack is sent (settle.Sent)
	msg.SetContext(settle.WithSent(msgCtx, sent))
	select {
	case s.out <- msg:
	case <-stop: // never handed to a handler: the drain gives it back
		cancel()
		return false
	}
	inflight.Add(1)
	go func() {
		defer inflight.Done()
		defer cancel()
		defer close(sent)
		select {
		case <-msg.Acked():
			// A probe consumer's ack waits for the gate's release to cancel
			// it (the gate is read for no other), and any ack once the
			// Consumer closes.
			switch {
			case closingNow(stop, s.c.closing):
				<-c.done
			case c.prefetch < s.c.cfg.Prefetch:
				if engaged, probing, _ := s.gateState(); !engaged && !probing { // released: the loop widens
					s.awaitCancel(c, func(_, probing bool) bool { return !probing })
				}
			}
			_ = d.Ack(false)
		case <-msg.Nacked():
			if closingNow(stop, s.c.closing) {
				<-c.done
			} else {
				s.awaitCancel(c, func(engaged, _ bool) bool { return engaged }) // the loop drains
			}
			_ = d.Nack(false, true)
		case <-over: // the channel is gone or drained past its timeout: the broker redelivers it
		}
	}()
	return true
}

// awaitCancel waits for c to be cancelled while the gate, read again at
// each change, has the consume loop cancel it (cancels: engaged, the loop
// drains c; not probing, a released probe's consumer is widened). A gate
// that moved on before the loop heard it — engaged, then probing or
// released; released, then probing again — leaves c consuming: the wait
// ends and the ack or nack is sent now, where it would have waited for a
// cancel that never came.
func (s *subscription) awaitCancel(c *consumer, cancels func(engaged, probing bool) bool) {
	for {
		engaged, probing, changed := s.gateState()
		if !cancels(engaged, probing) {
			return
		}
		select {
		case <-c.done:
			return
		case <-changed:
		}
	}
}

// closingNow reports whether the subscription is stopping: stop closed, or
// the Consumer's closing (stop closes next).
func closingNow(stop, closing <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	case <-closing:
		return true
	default:
		return false
	}
}

// drain cancels c (no new deliveries; the held ones may now be nacked),
// waits up to DrainTimeout for those in flight to be acked or nacked, then
// gives back those no handler took — held (taken from c.deliveries when
// stop closed) and the rest the broker sent before the cancel took effect
// — and closes the channel. They go back after those in flight, nacked one
// by one, in the order they came: a quorum queue redelivers returns in the
// order they reach it, and a delivery no handler took comes after every
// one handed out (an ordered handler's view gives a key's waiting
// deliveries back as the Consumer closes; returned first, the untaken one
// would overtake them). Nacked, not left to the channel's close: on
// RabbitMQ 4.3 and later a basic.nack with requeue does not count toward
// a quorum queue's delivery limit, while a close's return does. A broker
// that does not answer the cancel or the close within WriteTimeout more
// has conn closed under them.
func (s *subscription) drain(conn *amqp.Connection, ch *amqp.Channel, c *consumer, inflight *sync.WaitGroup, held ...amqp.Delivery) error {
	return closeWithin(conn, s.c.cfg.DrainTimeout+s.c.cfg.WriteTimeout, func() error { return s.drainChannel(ch, c, inflight, held) })
}

func (s *subscription) drainChannel(ch *amqp.Channel, c *consumer, inflight *sync.WaitGroup, held []amqp.Delivery) error {
	err := ch.Cancel(c.tag, false)
	c.stopped()
	s.c.cfg.Logger.Debug("Consumer cancelled; draining the deliveries in flight", watermill.LogFields{"queue": s.queue})
	if err == nil {
		for d := range c.deliveries { // closed once the client has flushed them; at most the prefetch
			held = append(held, d)
		}
	}
	done := make(chan struct{})
	go func() { inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.c.cfg.DrainTimeout):
		s.c.cfg.Logger.Error("Deliveries still in flight after the drain timeout; their channel closes and the broker redelivers them", nil,
			watermill.LogFields{"queue": s.queue, "drain_timeout": s.c.cfg.DrainTimeout.String()})
	}
	for _, d := range held {
		_ = d.Nack(false, true)
	}
	return ch.Close()
}

// Connected is the Consumer's Connected.
func (v gatedConsumer) Connected() bool { return v.c.Connected() }
