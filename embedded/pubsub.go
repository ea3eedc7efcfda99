package embedded

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/broker"
)

// ErrFull is matched by PubSub.Publish's error when the topic already holds
// Config.MaxQueued deliveries, and by DelayedPublisher.Publish's when
// MaxPending copies already wait.
var ErrFull = errors.New("embedded: embedded topic full")

// errClosed is matched by PubSub's Publish and Subscribe errors after
// Close, and by DelayedPublisher.Publish's after its Close.
var errClosed = errors.New("embedded: embedded broker closed")

// PubSub is the embedded default's in-process broker: one bounded
// queue per topic, read by competing subscriptions, at least once. A
// published message waits in its topic until a subscription takes it — with
// or without a subscriber, never dropped — and stays tracked until its
// handler acks it; a nack puts it back at the head of the topic. Publish
// returns once the messages are stored (a copy of each).
//
// A subscription hands out at most MaxInFlight deliveries before the first
// is settled, on an unbuffered channel, so nothing waits in a buffer the
// router would start after its Close. It closes by draining: when its
// context ends or its subscriber closes it stops handing out, cancels the
// contexts of the deliveries in flight (behind middleware.ShutdownGrace the
// handler still gets its grace), waits up to DrainTimeout for them to be
// acked or nacked, and only then closes its channel. Close returns an
// *UnfinishedError naming every delivery not acked. Not durable: it all
// lives in this process's memory. Safe for concurrent use.
type PubSub struct {
	maxQueued, maxInFlight int
	drainTimeout           time.Duration
	logger                 watermill.LoggerAdapter
	sinks                  map[string]func(...*message.Message) // topics stored elsewhere (the poison topic)

	mu       sync.Mutex
	closed   bool
	closeErr error         // Close's report, returned by every call
	closeEnd chan struct{} // closed once the first Close has its report
	changed  chan struct{} // closed and replaced at every change
	topics   map[string]*embeddedTopic
	subs     map[*embeddedSubscription]struct{}
	abandon  chan struct{} // closed by Close: settlers stop waiting
}

var (
	_ message.Publisher  = (*PubSub)(nil)
	_ message.Subscriber = (*PubSub)(nil)
)

type embeddedTopic struct {
	ready    *list.List // of *message.Message, the stored copies, head first
	inflight map[*embeddedDelivery]struct{}
}

type embeddedDelivery struct {
	stored *message.Message // what goes back to the topic on a nack
	msg    *message.Message // the copy handed out
	cancel context.CancelFunc
}

type embeddedSubscription struct {
	topic    string
	out      chan *message.Message
	ctx      context.Context // the parent of the deliveries' contexts
	cancel   context.CancelFunc
	stop     chan struct{} // closed to begin the drain
	stopOnce sync.Once
	done     chan struct{} // closed once out is
	inflight int           // under PubSub.mu
	gate     broker.Gate   // stops the hand-out while engaged; nil: none
}

func (s *embeddedSubscription) halt() { s.stopOnce.Do(func() { close(s.stop) }) }

func newPubSub(cfg Config) *PubSub {
	return &PubSub{
		maxQueued: cfg.MaxQueued, maxInFlight: cfg.MaxInFlight, drainTimeout: cfg.DrainTimeout, logger: cfg.Logger,
		sinks:   map[string]func(...*message.Message){},
		changed: make(chan struct{}), topics: map[string]*embeddedTopic{},
		subs: map[*embeddedSubscription]struct{}{}, abandon: make(chan struct{}), closeEnd: make(chan struct{}),
	}
}

// broadcast wakes every waiter (p.mu held).
func (p *PubSub) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *PubSub) topic(name string) *embeddedTopic {
	t, ok := p.topics[name]
	if !ok {
		t = &embeddedTopic{ready: list.New(), inflight: map[*embeddedDelivery]struct{}{}}
		p.topics[name] = t
	}
	return t
}

// Publish stores a copy of each message in topic and returns; it fails,
// storing none, when the topic would hold more than MaxQueued deliveries
// (ErrFull) or after Close.
func (p *PubSub) Publish(topic string, msgs ...*message.Message) error {
	return p.publish(topic, false, msgs...)
}

// publish with unbounded set stores beyond MaxQueued: the copies back from
// the in-process tiers, bounded by MaxPendingRetries already.
func (p *PubSub) publish(topic string, unbounded bool, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("%w: publishing %d messages to %q", errClosed, len(msgs), topic)
	}
	if sink, ok := p.sinks[topic]; ok {
		sink(msgs...)
		return nil
	}
	t := p.topic(topic)
	if held := t.ready.Len() + len(t.inflight); !unbounded && held+len(msgs) > p.maxQueued {
		return fmt.Errorf("%w: %q holds %d deliveries (MaxQueued %d)", ErrFull, topic, held, p.maxQueued)
	}
	for _, m := range msgs {
		t.ready.PushBack(m.Copy()) // the caller may reuse m; its context is not kept
	}
	p.broadcast()
	return nil
}

// Subscribe returns a channel of topic's deliveries, shared with the other
// subscriptions to it. The channel closes once the subscription has
// drained, after ctx ends or Close.
func (p *PubSub) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s, err := p.subscribe(ctx, topic, nil)
	if err != nil {
		return nil, err
	}
	return s.out, nil
}

func (p *PubSub) subscribe(ctx context.Context, topic string, gate broker.Gate) (*embeddedSubscription, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("%w: subscribing to %q", errClosed, topic)
	}
	if _, ok := p.sinks[topic]; ok {
		return nil, fmt.Errorf("embedded: the embedded topic %q is not consumed by subscribing (read it with Broker.Poisoned)", topic)
	}
	p.topic(topic)
	sctx, cancel := context.WithCancel(ctx)
	s := &embeddedSubscription{topic: topic, out: make(chan *message.Message), ctx: sctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{}), gate: gate}
	p.subs[s] = struct{}{}
	go func() {
		select {
		case <-ctx.Done():
			s.halt()
		case <-s.done:
		}
	}()
	go p.deliver(s)
	return s, nil
}

// deliver hands out s's deliveries until it stops, then drains it.
func (p *PubSub) deliver(s *embeddedSubscription) {
	defer close(s.done)
	defer close(s.out)
	for p.handOut(s) {
	}
	p.drain(s)
}

// handOut hands out one delivery; false once s stops.
func (p *PubSub) handOut(s *embeddedSubscription) bool {
	d, ok := p.next(s)
	if !ok {
		return false
	}
	select {
	case s.out <- d.msg:
		go p.settle(s, d)
		return true
	case <-s.stop:
		p.settled(s, d, true) // never handed out: back to the head
		return false
	}
}

// next waits for a delivery s may take, and takes it; false once s stops.
func (p *PubSub) next(s *embeddedSubscription) (*embeddedDelivery, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		select {
		case <-s.stop:
			return nil, false
		default:
		}
		limit, gateChanged := p.limit(s)
		t := p.topics[s.topic]
		if front := t.ready.Front(); front != nil && s.inflight < limit {
			stored := t.ready.Remove(front).(*message.Message)
			ctx, cancel := context.WithCancel(s.ctx)
			d := &embeddedDelivery{stored: stored, msg: stored.Copy(), cancel: cancel}
			d.msg.SetContext(ctx)
			t.inflight[d] = struct{}{}
			s.inflight++
			return d, true
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-gateChanged:
		case <-s.stop:
		}
		p.mu.Lock()
	}
}

// limit is how many deliveries s may have in flight now: none while its
// gate is engaged, one while the gate probes (as rabbitmq.Consumer takes
// one at a time then), else MaxInFlight; and the gate's channel of its next
// change (nil without a gate).
func (p *PubSub) limit(s *embeddedSubscription) (int, <-chan struct{}) {
	if s.gate == nil {
		return p.maxInFlight, nil
	}
	engaged, changed := s.gate.Engaged()
	switch pg, ok := s.gate.(broker.ProbingGate); {
	case engaged:
		return 0, changed
	case ok && pg.Probing():
		return 1, changed
	}
	return p.maxInFlight, changed
}

// Depth returns how many deliveries topic holds: queued (never handed out,
// or nacked back) and in a handler (handed out, not yet acked or nacked).
func (p *PubSub) Depth(topic string) (queued, inFlight int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.topics[topic]; ok {
		return t.ready.Len(), len(t.inflight)
	}
	return 0, 0
}

// settle waits for d's ack or nack. After Close it stops waiting: d stays
// in flight, and Close has reported it.
func (p *PubSub) settle(s *embeddedSubscription, d *embeddedDelivery) {
	select {
	case <-d.msg.Acked():
		p.settled(s, d, false)
	case <-d.msg.Nacked():
		p.settled(s, d, true)
	case <-p.abandon:
	}
}

func (p *PubSub) settled(s *embeddedSubscription, d *embeddedDelivery, requeue bool) {
	d.cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.topics[s.topic]
	delete(t.inflight, d)
	s.inflight--
	if requeue {
		t.ready.PushFront(d.stored)
	}
	p.broadcast()
}

// drain cancels the contexts of s's deliveries in flight and waits up to
// the drain timeout for them to be settled.
func (p *PubSub) drain(s *embeddedSubscription) {
	s.cancel()
	timeout := time.NewTimer(p.drainTimeout)
	defer timeout.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	defer delete(p.subs, s)
	for s.inflight > 0 {
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
			p.mu.Lock()
		case <-timeout.C:
			p.mu.Lock()
			p.logger.Error("embedded deliveries still in a handler after the drain timeout; Close reports them", nil,
				watermill.LogFields{"topic": s.topic, "in_flight": s.inflight, "drain_timeout": p.drainTimeout.String()})
			return
		}
	}
}

// Close stops every subscription, draining each (see PubSub), and
// returns an *UnfinishedError naming the deliveries not acked: those still
// in a topic — never delivered, or nacked back — and those still in a
// handler after the drain. Publish and Subscribe fail from its start.
// Idempotent: every call returns the first one's report, once it has it.
func (p *PubSub) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.closeEnd
		return p.closeErr
	}
	p.closed = true
	subs := slices.Collect(maps.Keys(p.subs))
	p.mu.Unlock()
	p.closeSubscriptions(subs)
	p.mu.Lock()
	close(p.abandon)
	var u UnfinishedError
	for _, t := range p.topics {
		for e := t.ready.Front(); e != nil; e = e.Next() {
			u.Queued = append(u.Queued, e.Value.(*message.Message))
		}
		for d := range t.inflight {
			u.InFlight = append(u.InFlight, d.stored)
		}
	}
	if len(u.Queued)+len(u.InFlight) > 0 {
		p.closeErr = &u
	}
	p.mu.Unlock()
	close(p.closeEnd)
	return p.closeErr
}

// Publisher returns a publisher into p whose Close does nothing: give it
// as a handler's Publisher (Watermill's router closes a handler's
// publisher when the handler stops, which must not close the broker the
// other handlers, the tiers and Broker.Close still use).
func (p *PubSub) Publisher() message.Publisher { return embeddedPublisher{p, false} }

// embeddedPublisher publishes into p. With unbounded set it is the tiers'
// target: their copies go back to the topic beyond MaxQueued, as
// MaxPendingRetries bounds them already; after the router closed they wait
// in the topic like any other delivery, and Close reports them.
type embeddedPublisher struct {
	p         *PubSub
	unbounded bool
}

func (e embeddedPublisher) Publish(topic string, msgs ...*message.Message) error {
	return e.p.publish(topic, e.unbounded, msgs...)
}

func (embeddedPublisher) Close() error { return nil }

// closeSubscriptions stops subs and waits until each has drained.
func (p *PubSub) closeSubscriptions(subs []*embeddedSubscription) {
	for _, s := range subs {
		s.halt()
	}
	for _, s := range subs {
		<-s.done
	}
}

// subscriber returns a subscriber of p whose Close drains only the
// subscriptions made through it: what the router closes with a handler.
func (p *PubSub) subscriber() *embeddedSubscriber {
	return &embeddedSubscriber{p: p, subs: map[*embeddedSubscription]struct{}{}}
}

// subscriptions returns how many of p's subscriptions have not closed their
// channel yet.
func (p *PubSub) subscriptions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for s := range p.subs {
		select {
		case <-s.done:
		default:
			n++
		}
	}
	return n
}

type embeddedSubscriber struct {
	p    *PubSub
	gate broker.Gate
	mu   sync.Mutex
	subs map[*embeddedSubscription]struct{}
}

var _ broker.GatedSubscriber = (*embeddedSubscriber)(nil)

// WithGate returns a subscriber of the same broker whose subscriptions hand
// out nothing while g is engaged and one delivery at a time while it
// probes (broker.ProbingGate): router.Add gives it the handler's brake, so
// a held delivery goes back to the head of its topic at once and waits
// there, as on RabbitMQ.
func (s *embeddedSubscriber) WithGate(g broker.Gate) message.Subscriber {
	return &embeddedSubscriber{p: s.p, gate: g, subs: map[*embeddedSubscription]struct{}{}}
}

func (s *embeddedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sub, err := s.p.subscribe(ctx, topic, s.gate)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return sub.out, nil
}

// Close drains the subscriptions made through s and returns once each has
// closed its channel: the router's handler loop then ends with no delivery
// left to start.
func (s *embeddedSubscriber) Close() error {
	s.mu.Lock()
	subs := slices.Collect(maps.Keys(s.subs))
	clear(s.subs)
	s.mu.Unlock()
	s.p.closeSubscriptions(subs)
	return nil
}
