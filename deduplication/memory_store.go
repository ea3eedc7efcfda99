package deduplication

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicemq/sluice/unitofwork"
)

// MemoryStore is an in-process Store for tests and examples: it keeps every
// record in a map and forgets them when the process ends. A concurrent claim
// of a held pair waits until the holder ends, like the SQL store. It joins no
// business transaction. It is safe for concurrent use.
type MemoryStore struct {
	mu   sync.Mutex
	recs map[memKey]*memRecord
}

type memKey struct{ consumer, key string }

type memRecord struct {
	done  bool
	at    time.Time
	ended chan struct{} // made by the first waiter; closed when the holder ends
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{recs: make(map[memKey]*memRecord)}
}

// Begin starts a unit of work.
func (s *MemoryStore) Begin(context.Context) (unitofwork.Tx, error) { return &memTx{s: s}, nil }

// Len returns how many pairs are recorded as processed.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		if r.done {
			n++
		}
	}
	return n
}

// DeleteBefore deletes at most limit records processed before t.
func (s *MemoryStore) DeleteBefore(_ context.Context, t time.Time, limit int) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for k, r := range s.recs {
		if n >= int64(limit) {
			break
		}
		if r.done && r.at.Before(t) {
			delete(s.recs, k)
			n++
		}
	}
	return n, nil
}

var errMemTxDone = errors.New("deduplication: memory unit of work already ended")

type memTx struct {
	s     *MemoryStore
	rec   memRecord  // the record a claim holds: one allocation with the unit of work
	held  *memRecord // &rec once claimed
	key   memKey
	ended bool
}

func (t *memTx) Claim(ctx context.Context, consumer, key string) (bool, error) {
	if t.ended || t.held != nil {
		return false, errors.New("deduplication: Claim called twice or after the unit of work ended")
	}
	k := memKey{consumer, key}
	for {
		t.s.mu.Lock()
		r, ok := t.s.recs[k]
		switch {
		case !ok:
			t.held = &t.rec
			t.key = k
			t.s.recs[k] = t.held
			t.s.mu.Unlock()
			return true, nil
		case r.done:
			t.s.mu.Unlock()
			return false, nil
		}
		if r.ended == nil {
			r.ended = make(chan struct{})
		}
		ended := r.ended
		t.s.mu.Unlock()
		select {
		case <-ended:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

func (t *memTx) Commit(context.Context) error {
	if t.ended {
		return errMemTxDone
	}
	t.ended = true
	if t.held != nil {
		t.s.mu.Lock()
		t.held.done, t.held.at = true, time.Now()
		t.held.wake()
		t.s.mu.Unlock()
	}
	return nil
}

// wake releases the waiters, if any; called with the store's lock held.
func (r *memRecord) wake() {
	if r.ended != nil {
		close(r.ended)
		r.ended = nil
	}
}

func (t *memTx) Rollback(context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	if t.held != nil {
		t.s.mu.Lock()
		delete(t.s.recs, t.key)
		t.held.wake()
		t.s.mu.Unlock()
	}
	return nil
}
