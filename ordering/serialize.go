package ordering

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/internal/settle"
)

// returnedMax bounds how many deliveries of a key Serialize gives back
// while it waits for the key's given-back deliveries to come back, each in
// its turn: those the broker had sent before the give-back (at most the
// consumer's prefetch, rabbitmq's default Prefetch is 16), and those that come
// back out of their turn, again (fewer than 16 × 16 / 2 with that
// prefetch). A delivery that does not come back (dead-lettered by a quorum
// queue's delivery limit) must not make the key's later ones spend theirs.
const returnedMax = 1024

// sentWait bounds how long Serialize waits for a subscriber that does not
// say when it has sent a delivery's nack (internal/settle) before it nacks
// the key's next one: it is taken to have sent it when the delivery's
// context ends (watermill-amqp's and the embedded broker's end it then);
// one that never ends it costs its key this much per delivery given back.
const sentWait = 2 * time.Second

// ownSentWait bounds the wait for a subscriber that says so itself
// (Sluice's Consumer, once its nack is written; also when its channel is
// gone). Its nack is sent at once, but on a loaded machine "at once" took
// more than sentWait: the key's next nack overtook it, and the broker
// redelivered the key's waiting deliveries before its head, each counted
// one return more (TestAGivenBackHeadsNackSentLateIsNotOvertaken).
const ownSentWait = time.Minute

// Serialize returns a view of sub whose subscriptions hand the router one
// delivery of a key at a time, in the order sub delivered them; deliveries
// of other keys run concurrently, as many as sub keeps in flight (the
// Consumer's Prefetch). A delivery whose key has one in flight waits in
// memory (never more than sub has in flight).
//
// When a delivery is nacked (given back: the brake, a shutdown, a failure
// the stages could not settle), the later deliveries of its key that wait
// are nacked too, and Serialize hands them out again in that order — the
// given-back one first, then each of those, in its turn: a delivery of the
// key that comes back out of its turn is nacked again, as is every later
// delivery of the key that arrives before they are all back.
//
// A quorum queue redelivers what is given back in the order the nacks
// reach it, and on RabbitMQ 3.x and 4.0–4.2 each return counts toward its
// x-delivery-limit. So Serialize nacks a key's deliveries one after
// another, each once the subscriber has sent the nack before it — Sluice's
// Consumer says when it has (waited for at most ownSentWait); of another
// subscriber, the delivery's context ending is taken for it (at most
// sentWait) — and they come back in their
// order: each is returned once per give-back, as often as the key's head
// and no more. The key's next delivery is handed out once they are all
// sent. (A classic queue puts a returned delivery back in its place: its
// order holds either way.) Closing the view nacks the waiting deliveries —
// never handed to a handler — the same way, each key's in its order, once
// the key's delivery in flight is settled (after it when it is nacked),
// and closes sub: the view that replaces it (a restart) gets them in
// their order.
func (o *Orderer) Serialize(sub message.Subscriber) message.Subscriber {
	return &serial{o: o, sub: sub, closing: make(chan struct{})}
}

type serial struct {
	o       *Orderer
	sub     message.Subscriber
	once    sync.Once
	closing chan struct{}
	wg      sync.WaitGroup
	// stopped, when set (a test), is called once a subscription's loop has
	// begun stopping: what waits and has no delivery of its key in flight
	// is being given back; what waits behind one in flight is held.
	stopped func()
	// reporting, when set (a test), is called by the goroutine that watches
	// a delivery handed out once the delivery is settled, before it tells
	// the subscription's loop.
	reporting func()
}

// item is a delivery Serialize holds.
type item struct {
	msg     *message.Message
	sent    sent
	key, id string
}

// sent says when the subscriber has sent a delivery's ack or nack: c is
// closed then (nil: never), waited for at most wait.
type sent struct {
	c    <-chan struct{}
	wait time.Duration
}

// sentOf returns m's: the subscriber's own signal (settle.Sent), waited
// for as long as ownSentWait; else the end of m's context, at most
// sentWait.
func sentOf(m *message.Message) sent {
	if c := settle.Sent(m.Context()); c != nil {
		return sent{c: c, wait: ownSentWait}
	}
	return sent{c: m.Context().Done(), wait: sentWait}
}

func (s *serial) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.loop(ctx, in, out)
	}()
	return out, nil
}

// Close nacks the deliveries waiting for their key, then closes the
// subscriber (which drains those in flight).
func (s *serial) Close() error {
	s.once.Do(func() { close(s.closing) })
	err := s.sub.Close()
	s.wg.Wait()
	return err
}

// Connected is the subscriber's, when it reports one (service readiness).
func (s *serial) Connected() bool {
	if c, ok := s.sub.(interface{ Connected() bool }); ok {
		return c.Connected()
	}
	return true
}

type settled struct {
	key    string
	id     string
	sent   sent
	nacked bool
	msg    *message.Message
}

// settledNow reports whether it, handed out, is acked or nacked already.
func settledNow(it item) (settled, bool) {
	st := settled{key: it.key, id: it.id, sent: it.sent, msg: it.msg}
	select {
	case <-it.msg.Acked():
		return st, true
	case <-it.msg.Nacked():
		st.nacked = true
		return st, true
	default:
		return st, false
	}
}

func (s *serial) loop(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message) {
	defer close(out)
	quit := make(chan struct{})
	var watchers, chains sync.WaitGroup
	defer func() { close(quit); watchers.Wait(); chains.Wait() }()
	queues := map[string][]item{} // per key: the one in flight first, then those waiting
	// returned: per key, the event ids given back, in their order — the
	// nacked delivery's, then those that waited behind it — each awaited
	// in its turn, and how many deliveries out of turn were given back
	// meanwhile. Not only the first: the broker redelivers what is given
	// back in the order the nacks reach it (each is sent on its own), a
	// later one possibly before an earlier one.
	type awaited struct {
		ids   []string
		later int
	}
	returned := map[string]*awaited{}
	var ready []item // first of their key, not yet handed out
	done := make(chan settled)
	stopping := false
	// given: per key, the sent signal of the last delivery Serialize gave
	// back (or of the given-back head): the key's next give-back waits for
	// the subscriber to have sent its nack.
	given := map[string]sent{}
	// chaining: per key, the give-backs whose nacks are still being sent.
	// The key's next delivery is handed out once they are all sent: were it
	// given back meanwhile, its nack would reach the broker among them.
	chaining := map[string]int{}
	chained := make(chan string)
	giveBack := func(key string, after sent, its []item) {
		if len(its) == 0 {
			if after.c != nil { // a head given back alone: the key's next give-back waits for its nack
				given[key] = after
			}
			return
		}
		if after.c == nil {
			after = given[key]
		}
		given[key] = its[len(its)-1].sent
		if after.c == nil { // nothing to wait for: given back now
			its[0].msg.Nack()
			after, its = its[0].sent, its[1:]
		}
		chaining[key]++
		chains.Add(1)
		go func() {
			defer chains.Done()
			defer func() {
				select {
				case chained <- key:
				case <-quit:
				}
			}()
			for _, it := range its {
				if after.c != nil {
					t := time.NewTimer(after.wait)
					select {
					case <-after.c:
					case <-quit:
					case <-t.C:
					}
					t.Stop()
				}
				it.msg.Nack()
				after = it.sent
			}
		}()
	}
	// nackAll gives back each key that has none in flight, in its order;
	// a key whose delivery is in flight is given back once that one is
	// settled, after it when it is nacked (below).
	nackAll := func() {
		for _, it := range ready {
			giveBack(it.key, sent{}, queues[it.key])
			delete(queues, it.key)
		}
		ready = nil
	}
	stop := func() {
		if stopping {
			return
		}
		stopping = true
		nackAll()
		if s.stopped != nil {
			s.stopped()
		}
	}
	inflight := 0
	// handed: per key, the delivery handed out and not yet settled here. A
	// watcher's report of one no longer there was settled when its key's
	// next delivery came, and is dropped.
	handed := map[string]item{}
	// moveOn moves the key of st, a delivery handed out, on: its waiting
	// deliveries given back after it when it was nacked, the next one ready
	// when it was acked.
	moveOn := func(st settled) {
		inflight--
		delete(handed, st.key)
		q := queues[st.key][1:]
		if st.nacked {
			var ids []string
			if st.id != "" {
				ids = append(ids, st.id)
			}
			for _, it := range q {
				if it.id != "" {
					ids = append(ids, it.id)
				}
			}
			giveBack(st.key, st.sent, q) // after the head's nack is sent
			q = nil
			if want, ok := returned[st.key]; ok { // given back before, not all come back yet: after these
				ids = append(ids, want.ids...)
			}
			if !stopping && len(ids) > 0 {
				returned[st.key] = &awaited{ids: ids}
			}
		} else if stopping { // acked: the key's waiting ones go back
			giveBack(st.key, sent{}, q)
			q = nil
		}
		if len(q) == 0 {
			delete(queues, st.key)
			return
		}
		queues[st.key] = q
		if !stopping {
			ready = append(ready, q[0])
		}
	}
	closing := s.closing
	ended := ctx.Done() // heard once: the loop then waits for what is in flight
	for {
		if stopping && in == nil && inflight == 0 {
			return
		}
		var send chan<- *message.Message
		var next *message.Message
		first := -1 // the first ready whose key's nacks are all sent
		for i := 0; i < len(ready) && !stopping; i++ {
			if chaining[ready[i].key] == 0 {
				first = i
				break
			}
		}
		if first >= 0 {
			send, next = out, ready[first].msg
		}
		select {
		case key := <-chained:
			if chaining[key]--; chaining[key] == 0 {
				delete(chaining, key)
			}
		case <-closing:
			stop()
			closing = nil
		case <-ended:
			ended = nil
			stop()
		case m, ok := <-in:
			if !ok {
				in = nil
				stop()
				continue
			}
			k := &keyed{}
			k.key, k.kErr = s.o.cfg.Key(m)
			k.id, k.idErr = s.o.cfg.eventID(m)
			m.SetContext(context.WithValue(m.Context(), keyedKey{}, k)) // read once: Middleware finds them
			key, id := k.key, k.id
			if k.kErr != nil { // the stages poison it: nothing to order
				key = "\x00" + watermill.NewShortUUID()
			}
			it := item{msg: m, sent: sentOf(m), key: key, id: id}
			if h, ok := handed[key]; ok && id != "" && h.id == id {
				// The key's delivery handed out, back: given back, the
				// broker sent it again before its watcher told the loop of
				// the nack. It is settled first, or the head would wait
				// behind itself and be given back again with every delivery
				// of its key. (A later delivery of the key that comes first
				// waits behind it as ever, and goes back with it once.)
				if st, ok := settledNow(h); ok {
					moveOn(st)
				}
			}
			if stopping {
				if _, ok := queues[key]; ok { // given back with the key's waiting ones
					queues[key] = append(queues[key], it)
				} else {
					giveBack(key, sent{}, []item{it})
				}
				continue
			}
			if want, ok := returned[key]; ok {
				if id != want.ids[0] && want.later < returnedMax {
					want.later++
					giveBack(key, sent{}, []item{it})
					continue
				}
				if id != want.ids[0] {
					s.o.cfg.Logger.Error("A key's given-back delivery did not come back in its turn; its order may be broken", errors.New("ordering: given-back delivery not seen"),
						watermill.LogFields{"handler": s.o.cfg.Consumer})
					delete(returned, key)
				} else if want.ids = want.ids[1:]; len(want.ids) == 0 {
					delete(returned, key)
				}
				if _, ok := returned[key]; !ok {
					delete(given, key) // all back: every nack was sent
				}
			}
			queues[key] = append(queues[key], it)
			if len(queues[key]) == 1 {
				ready = append(ready, it)
			}
		case send <- next:
			it := ready[first]
			ready = append(ready[:first], ready[first+1:]...)
			inflight++
			handed[it.key] = it
			watchers.Add(1)
			go func() {
				defer watchers.Done()
				select {
				case <-it.msg.Acked():
				case <-it.msg.Nacked():
				case <-quit:
					return
				}
				st, _ := settledNow(it)
				if s.reporting != nil {
					s.reporting()
				}
				select {
				case done <- st:
				case <-quit:
				}
			}()
		case st := <-done:
			if h, ok := handed[st.key]; !ok || h.msg != st.msg { // settled when its key's next delivery came
				continue
			}
			moveOn(st)
		}
	}
}
