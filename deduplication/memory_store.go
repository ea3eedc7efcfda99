package deduplication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicemq/sluice/unitofwork"
)

// MemoryStore is an in-process Store for tests and examples: it keeps every
// record in a map and forgets them when the process ends. A concurrent claim
// of a held pair waits until the holder ends, like the SQL store. It joins no
// business transaction: a batch handler on it never runs a batch again
// (ClaimReleaser), so a panic or one error for all fails each event of
// the batch where the SQL store would narrow it down — test those paths
// on the SQL store (SQLite). It is safe for concurrent use.
type MemoryStore struct {
	mu   sync.Mutex
	recs map[memKey]*memRecord
}

type memKey struct{ consumer, key string }

type memRecord struct {
	done  bool
	at    time.Time
	ended chan struct{} // made by the first waiter; closed when the holder ends
	owner *memTx        // the unit of work that claimed it
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

// memTx is a MemoryStore's unit of work: one Claim, or one or more
// ClaimBatch calls (a batch handler's).
type memTx struct {
	s     *MemoryStore
	rec   memRecord  // the first record it claims: one allocation with the unit of work
	held  *memRecord // &rec once claimed
	key   memKey
	more  []memClaim // the claims after the first (ClaimBatch)
	ended bool
}

type memClaim struct {
	key memKey
	rec *memRecord
}

var _ ClaimReleaser = (*memTx)(nil)

func (t *memTx) Claim(ctx context.Context, consumer, key string) (bool, error) {
	if t.ended || t.held != nil {
		return false, errors.New("deduplication: Claim called twice or after the unit of work ended")
	}
	return t.claim(ctx, memKey{consumer, key})
}

// ClaimBatch claims each of keys in turn, as Claim does, in this unit of
// work; a key another open unit of work holds is waited for at most wait
// (0: until ctx ends), then the call fails with ErrClaimInProgress, and
// the unit of work keeps what it claimed until its Rollback. idle does not
// apply: nothing here is held open on a server.
func (t *memTx) ClaimBatch(ctx context.Context, consumer string, keys []string, wait, _ time.Duration) ([]string, error) {
	if t.ended {
		return nil, errMemTxDone
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, wait, errHeldPastWait)
		defer cancel()
	}
	got := make([]string, 0, len(keys))
	for _, key := range keys {
		ok, err := t.claim(ctx, memKey{consumer, key})
		if err != nil {
			return nil, err
		}
		if ok {
			got = append(got, key)
		}
	}
	return got, nil
}

// ReleaseClaims gives back the claims of keys this unit of work holds
// (ClaimReleaser): a batch handler's failed events; the commit records the
// others.
func (t *memTx) ReleaseClaims(_ context.Context, consumer string, keys []string) error {
	if t.ended {
		return errMemTxDone
	}
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	for _, key := range keys {
		k := memKey{consumer, key}
		if r, ok := t.s.recs[k]; ok && r.owner == t {
			delete(t.s.recs, k)
			r.owner = nil
			r.wake()
		}
	}
	return nil
}

// errHeldPastWait ends ClaimBatch's wait for a key another unit of work holds.
var errHeldPastWait = errors.New("deduplication: held past the claim's wait")

// claim records k for t unless it is done; while another unit of work holds
// it, it waits for that one to end, until ctx ends — an error matching
// ErrClaimInProgress when ClaimBatch's wait ran out, ctx's error otherwise. A
// key t holds already reports false.
func (t *memTx) claim(ctx context.Context, k memKey) (bool, error) {
	for {
		t.s.mu.Lock()
		r, ok := t.s.recs[k]
		switch {
		case !ok:
			if t.held == nil {
				r, t.held, t.key = &t.rec, &t.rec, k
			} else {
				r = &memRecord{}
				t.more = append(t.more, memClaim{k, r})
			}
			r.owner = t
			t.s.recs[k] = r
			t.s.mu.Unlock()
			return true, nil
		case r.done, r.owner == t:
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
			if context.Cause(ctx) == errHeldPastWait {
				return false, fmt.Errorf("%w: (%s, %s) held by another unit of work", ErrClaimInProgress, k.consumer, k.key)
			}
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
		now := time.Now()
		t.s.mu.Lock()
		t.held.done, t.held.at, t.held.owner = true, now, nil
		t.held.wake()
		for _, c := range t.more {
			c.rec.done, c.rec.at, c.rec.owner = true, now, nil
			c.rec.wake()
		}
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
		t.release(t.key, t.held)
		for _, c := range t.more {
			t.release(c.key, c.rec)
		}
		t.s.mu.Unlock()
	}
	return nil
}

// release deletes k's record r, unless ReleaseClaims gave it back before
// (another unit of work's may be there now), and wakes its waiters; called
// with the store's lock held.
func (t *memTx) release(k memKey, r *memRecord) {
	if t.s.recs[k] == r {
		delete(t.s.recs, k)
	}
	r.wake()
}
