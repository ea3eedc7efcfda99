package ordering

import (
	"context"
	"slices"
	"sync"
	"time"
)

// memoryStore is NewMemoryStore's Store.
type memoryStore struct {
	mu    sync.Mutex
	keys  map[memKey]*memState
	locks map[memKey]chan struct{} // a key's lock: a channel of one
}

type memKey struct{ consumer, key string }

type memState struct {
	Key
	held []Held
}

// NewMemoryStore returns an empty in-process Store for tests and examples
// (sluicetest): it forgets everything when the process ends. It is safe
// for concurrent use.
func NewMemoryStore() Store {
	return &memoryStore{keys: map[memKey]*memState{}, locks: map[memKey]chan struct{}{}}
}

// Lock waits until no other guard of the key is open, or ctx ends.
func (s *memoryStore) Lock(ctx context.Context, consumer, key string) (Guard, error) {
	k := memKey{consumer, key}
	s.mu.Lock()
	l, ok := s.locks[k]
	if !ok {
		l = make(chan struct{}, 1)
		s.locks[k] = l
	}
	s.mu.Unlock()
	select {
	case l <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	g := &memGuard{s: s, k: k, lock: l}
	s.mu.Lock()
	if st, ok := s.keys[k]; ok {
		c := *st
		c.held = slices.Clone(st.held)
		g.st = &c
	}
	s.mu.Unlock()
	return g, nil
}

// Waits reports whether the key waits.
func (s *memoryStore) Waits(_ context.Context, consumer, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.keys[memKey{consumer, key}]
	return ok, nil
}

// Releasable returns the keys whose head is done and that still hold
// messages, skipping locked ones.
func (s *memoryStore) Releasable(_ context.Context, consumer string, limit int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, st := range s.keys {
		if k.consumer == consumer && st.Head == "" && len(st.held) > 0 && len(s.locks[k]) == 0 && len(out) < limit {
			out = append(out, k.key)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Keys returns the waiting keys, the oldest first.
func (s *memoryStore) Keys(_ context.Context, consumer string, limit int) ([]Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Key
	for k, st := range s.keys {
		if k.consumer == consumer {
			c := st.Key
			c.Held = len(st.held)
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b Key) int { return a.Since.Compare(b.Since) })
	return out[:min(len(out), limit)], nil
}

// Stats counts the waiting keys.
func (s *memoryStore) Stats(_ context.Context, consumer string) (Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st Stats
	for k, v := range s.keys {
		if k.consumer != consumer {
			continue
		}
		switch {
		case v.Head == "":
			st.Releasing++
		case v.Poisoned:
			st.Poisoned++
		default:
			st.Blocked++
		}
		st.Held += len(v.held)
		if st.Oldest.IsZero() || v.Since.Before(st.Oldest) {
			st.Oldest = v.Since
		}
	}
	return st, nil
}

// memGuard works on a copy of the key's state, written back at Commit.
type memGuard struct {
	s    *memoryStore
	k    memKey
	lock chan struct{}
	st   *memState // nil: the key does not wait
	done bool
}

func (g *memGuard) State(context.Context) (Key, bool, error) {
	if g.st == nil {
		return Key{}, false, nil
	}
	return g.st.Key, true, nil
}

func (g *memGuard) Hold(_ context.Context, m Held) error {
	if g.st == nil {
		return errNotWaiting
	}
	if slices.ContainsFunc(g.st.held, func(h Held) bool { return h.EventID == m.EventID }) {
		return nil
	}
	g.st.held = append(g.st.held, m)
	return nil
}

func (g *memGuard) Block(_ context.Context, head string, poisoned bool, reason string) error {
	if g.st == nil {
		g.st = &memState{Key: Key{Key: g.k.key, Since: time.Now()}}
	}
	g.st.Head, g.st.Poisoned, g.st.Reason = head, poisoned, reason
	return nil
}

func (g *memGuard) Unblock(context.Context) error {
	if g.st == nil {
		return nil
	}
	if len(g.st.held) == 0 {
		g.st = nil
		return nil
	}
	g.st.Head, g.st.Poisoned, g.st.Reason = "", false, ""
	return nil
}

func (g *memGuard) Next(context.Context) (Held, bool, error) {
	if g.st == nil || len(g.st.held) == 0 {
		return Held{}, false, nil
	}
	return g.st.held[0], true, nil
}

func (g *memGuard) Remove(_ context.Context, id string) error {
	if g.st != nil {
		g.st.held = slices.DeleteFunc(g.st.held, func(h Held) bool { return h.EventID == id })
	}
	return nil
}

func (g *memGuard) Commit(context.Context) error {
	if g.done {
		return errGuardDone
	}
	g.s.mu.Lock()
	if g.st == nil {
		delete(g.s.keys, g.k)
	} else {
		g.s.keys[g.k] = g.st
	}
	g.s.mu.Unlock()
	g.end()
	return nil
}

func (g *memGuard) Rollback(context.Context) error {
	g.end()
	return nil
}

func (g *memGuard) end() {
	if !g.done {
		g.done = true
		<-g.lock
	}
}
