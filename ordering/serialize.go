package ordering

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// returnedMax bounds how many deliveries of a key Serialize gives back
// while it waits for the key's given-back deliveries to come back, each in
// its turn: those the broker had sent before the give-back (at most the
// consumer's prefetch, rabbitmq.PrefetchDefault is 16), and those that come
// back out of their turn, again (fewer than 16 × 16 / 2 with that
// prefetch). A delivery that does not come back (dead-lettered by a quorum
// queue's delivery limit) must not make the key's later ones spend theirs.
const returnedMax = 1024

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
// delivery of the key that arrives before they are all back. The broker
// redelivers them in the order the nacks reach it (each is sent on its
// own; a classic queue hands a requeued delivery out at once while the
// consumer has room, a quorum queue returns them ahead of the rest), which
// need not be the order they were given back in; Serialize restores it.
// Closing the view nacks the waiting deliveries — never handed to a
// handler — and closes sub.
func (o *Orderer) Serialize(sub message.Subscriber) message.Subscriber {
	return &serial{o: o, sub: sub, closing: make(chan struct{})}
}

type serial struct {
	o       *Orderer
	sub     message.Subscriber
	once    sync.Once
	closing chan struct{}
	wg      sync.WaitGroup
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
	nacked bool
}

func (s *serial) loop(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message) {
	defer close(out)
	quit := make(chan struct{})
	var watchers sync.WaitGroup
	defer func() { close(quit); watchers.Wait() }()
	type item struct {
		msg     *message.Message
		key, id string
	}
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
	nackAll := func() {
		for _, it := range ready {
			it.msg.Nack()
		}
		ready = nil
		for k, q := range queues {
			for _, it := range q[1:] {
				it.msg.Nack()
			}
			queues[k] = q[:1]
		}
	}
	inflight := 0
	closing := s.closing
	for {
		if stopping && in == nil && inflight == 0 {
			return
		}
		var send chan<- *message.Message
		var next *message.Message
		if len(ready) > 0 && !stopping {
			send, next = out, ready[0].msg
		}
		select {
		case <-closing:
			if !stopping {
				stopping = true
				nackAll()
			}
			closing = nil
		case <-ctx.Done():
			if !stopping {
				stopping = true
				nackAll()
			}
		case m, ok := <-in:
			if !ok {
				in = nil
				stopping = true
				nackAll()
				continue
			}
			if stopping {
				m.Nack()
				continue
			}
			k := &keyed{}
			k.key, k.kErr = s.o.cfg.Key(m)
			k.id, k.idErr = s.o.cfg.EventID(m)
			m.SetContext(context.WithValue(m.Context(), keyedKey{}, k)) // read once: Middleware finds them
			key, id := k.key, k.id
			if k.kErr != nil { // the stages poison it: nothing to order
				key = "\x00" + watermill.NewShortUUID()
			}
			if want, ok := returned[key]; ok {
				if id != want.ids[0] && want.later < returnedMax {
					want.later++
					m.Nack()
					continue
				}
				if id != want.ids[0] {
					s.o.cfg.Logger.Error("A key's given-back delivery did not come back in its turn; its order may be broken", errors.New("ordering: given-back delivery not seen"),
						watermill.LogFields{"handler": s.o.cfg.Consumer})
					delete(returned, key)
				} else if want.ids = want.ids[1:]; len(want.ids) == 0 {
					delete(returned, key)
				}
			}
			it := item{msg: m, key: key, id: id}
			queues[key] = append(queues[key], it)
			if len(queues[key]) == 1 {
				ready = append(ready, it)
			}
		case send <- next:
			it := ready[0]
			ready = ready[1:]
			inflight++
			watchers.Add(1)
			go func() {
				defer watchers.Done()
				st := settled{key: it.key, id: it.id}
				select {
				case <-it.msg.Acked():
				case <-it.msg.Nacked():
					st.nacked = true
				case <-quit:
					return
				}
				select {
				case done <- st:
				case <-quit:
				}
			}()
		case st := <-done:
			inflight--
			q := queues[st.key][1:]
			if st.nacked {
				var ids []string
				if st.id != "" {
					ids = append(ids, st.id)
				}
				for _, it := range q {
					it.msg.Nack()
					if it.id != "" {
						ids = append(ids, it.id)
					}
				}
				q = nil
				if want, ok := returned[st.key]; ok { // given back before, not all come back yet: after these
					ids = append(ids, want.ids...)
				}
				if !stopping && len(ids) > 0 {
					returned[st.key] = &awaited{ids: ids}
				}
			}
			if len(q) == 0 {
				delete(queues, st.key)
				continue
			}
			queues[st.key] = q
			if !stopping {
				ready = append(ready, q[0])
			}
		}
	}
}
