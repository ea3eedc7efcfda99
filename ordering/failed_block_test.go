package ordering_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/ordering"
)

// failingCommits is a memory Store whose units of work that blocked a key
// fail their Commit, as many times as armed: the key's row lock timed out
// (55P03), the session ended, the commit was lost.
type failingCommits struct {
	ordering.Store
	armed atomic.Int32
}

func (s *failingCommits) Lock(ctx context.Context, consumer, key string) (ordering.Guard, error) {
	g, err := s.Store.Lock(ctx, consumer, key)
	if err != nil {
		return nil, err
	}
	return &failingGuard{Guard: g, s: s}, nil
}

type failingGuard struct {
	ordering.Guard
	s       *failingCommits
	blocked bool
}

func (g *failingGuard) Block(ctx context.Context, head string, poisoned bool, reason string) error {
	g.blocked = true
	return g.Guard.Block(ctx, head, poisoned, reason)
}

func (g *failingGuard) Commit(ctx context.Context) error {
	if g.blocked && g.s.armed.Add(-1) >= 0 {
		_ = g.Guard.Rollback(ctx)
		return errors.New("pq: canceling statement due to lock timeout (55P03)")
	}
	return g.Guard.Commit(ctx)
}

// world stands for the stages inside the ordering stage: an inbox (each
// event applied once), a handler whose message id fails its first
// fails[id] attempts, and a retry stage that publishes each failed
// attempt's copy to a tier (the slice tier) before it returns.
type world struct {
	mu      sync.Mutex
	fails   map[string]int
	done    map[string]bool
	applied []string
	tier    []*message.Message
}

func (w *world) stages(msg *message.Message) ([]*message.Message, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id := msg.Metadata.Get(sluice.EventIDKey)
	if w.done[id] {
		sluice.Record(msg.Context(), func(r *sluice.Report) { r.Outcome = sluice.OutcomeDuplicate })
		return nil, nil
	}
	attempt, err := sluice.Attempt(msg)
	if err != nil {
		return nil, err
	}
	if attempt <= w.fails[id] {
		c := msg.Copy()
		c.Metadata.Set(sluice.AttemptKey, strconv.Itoa(attempt+1))
		w.tier = append(w.tier, c)
		sluice.Record(msg.Context(), func(r *sluice.Report) {
			r.Outcome, r.Tier, r.Attempt = sluice.OutcomeRetried, "t1", attempt+1
		})
		return nil, nil
	}
	w.done[id] = true
	w.applied = append(w.applied, id)
	return nil, nil
}

// again is a delivery of m again (the broker's redelivery of a given-back
// one): a new message, the same metadata.
func again(m *message.Message) *message.Message {
	c := message.NewMessage(m.UUID, m.Payload)
	for k, v := range m.Metadata {
		c.Metadata.Set(k, v)
	}
	return c
}

// The block of a key whose delivery went to a tier can fail after the
// retry stage published the delivery's copy: the copy is in its tier, the
// key does not wait, the delivery is nacked. Whichever comes back first —
// the copy, or the original given back — and in whatever order the broker
// redelivers the deliveries Serialize gave back (the order their nacks
// reached it), the key applies in order, each once: Serialize hands out
// what it gave back in its order, each event id in its turn (the copy is
// a delivery of its event id), and a delivery of the given-back event id
// either applies it or makes the key wait for it again. Before Serialize
// kept that order, a-3 could come back before a-2, given back again while
// a-1 was awaited, and apply before it.
func TestAFailedBlockAfterTheCopyKeepsTheKeysOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		fails        int   // failing attempts of a-1
		commitsFail  int32 // failed commits of a block
		originalLast bool  // the given-back a-1 comes back after the key's later ones
	}{
		{name: "fails once, the copy back first, the later ones before the original", fails: 1, commitsFail: 1, originalLast: true},
		{name: "fails once, the copy back first, the original next", fails: 1, commitsFail: 1},
		{name: "fails twice, the copy back first (it fails and blocks), the later ones before the original", fails: 2, commitsFail: 1, originalLast: true},
		{name: "fails twice, two blocks fail", fails: 2, commitsFail: 2, originalLast: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &failingCommits{Store: ordering.NewMemoryStore()}
			o, err := ordering.New(ordering.Config{Store: store, Consumer: "ledger", Key: sluice.KeyFromMetadata("account")})
			require.NoError(t, err)
			w := &world{fails: map[string]int{"a-1": tc.fails}, done: map[string]bool{}}
			mw := o.Middleware(w.stages)
			in := feed{ch: make(chan *message.Message, 16)}
			sub := o.Serialize(in)
			out, err := sub.Subscribe(t.Context(), "q")
			require.NoError(t, err)
			// handle runs what Serialize hands out through the stage and
			// settles it as the router does.
			handle := func(m *message.Message) {
				if _, err := mw(m); err != nil {
					m.Nack()
					return
				}
				m.Ack()
			}

			// The broker: every delivery fed to Serialize is settled —
			// handed out and acked or nacked by handle, or given back by
			// Serialize. What is nacked goes back to the queue; once
			// nothing is in flight, the tier's copies come back first (they
			// reached the consumer before the nacks), then what was given
			// back — the key's later deliveries before a-1's own when
			// originalLast.
			type settlement struct {
				m      *message.Message
				nacked bool
			}
			settledCh := make(chan settlement)
			unsettled := 0
			feed := func(ms ...*message.Message) {
				for _, m := range ms {
					unsettled++
					go func() {
						select {
						case <-m.Acked():
							settledCh <- settlement{m: m}
						case <-m.Nacked():
							settledCh <- settlement{m: m, nacked: true}
						}
					}()
					in.ch <- m
				}
			}
			store.armed.Store(tc.commitsFail)
			feed(msg("a", "a-1"), msg("a", "a-2"), msg("a", "a-3"))
			var back []*message.Message
			for step := 0; ; step++ {
				require.Less(t, step, 200, "the key settles")
				if unsettled == 0 {
					w.mu.Lock()
					copies := w.tier
					w.tier = nil
					w.mu.Unlock()
					if len(copies) == 0 && len(back) == 0 {
						break
					}
					var first, last []*message.Message
					for _, m := range back {
						if tc.originalLast && m.UUID == "a-1" {
							last = append(last, m)
						} else {
							first = append(first, m)
						}
					}
					feed(append(append(copies, first...), last...)...)
					back = nil
				}
				select {
				case m := <-out:
					handle(m)
				case s := <-settledCh:
					unsettled--
					if s.nacked {
						back = append(back, again(s.m))
					}
				}
			}
			require.Equal(t, []string{"a-1", "a-2", "a-3"}, w.applied, "the key's effects in publish order, each once")
			keys, err := store.Keys(t.Context(), "ledger", 10)
			require.NoError(t, err)
			require.Empty(t, keys, "the key waits for nothing")

			close(in.ch)
			require.NoError(t, sub.Close())
			require.NoError(t, o.Close())
		})
	}
}
