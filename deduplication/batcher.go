package deduplication

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// batcher gathers one stage's deliveries into batches.
type batcher struct {
	d           *deduplicator
	cfg         BatchConfig
	timer       func(time.Duration) *time.Timer // time.NewTimer but in a test
	unsupported atomic.Bool

	mu   sync.Mutex
	open *batch // taking in deliveries, or nil
	// suspects are keys whose batch failed to commit: their next delivery
	// runs alone, so a delivery that makes every commit fail (a deferred
	// constraint) fails alone, and the copies of its neighbours, retried in
	// lockstep with it, do not fail with it again and again. Bounded.
	suspects map[string]struct{}
	order    []string
}

// suspectsMax bounds the keys a batcher remembers as suspects.
const suspectsMax = 4096

// suspect remembers keys whose batch failed to commit.
func (bt *batcher) suspect(keys []string) {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if bt.suspects == nil {
		bt.suspects = map[string]struct{}{}
	}
	for _, k := range keys {
		if _, ok := bt.suspects[k]; ok {
			continue
		}
		if len(bt.order) >= suspectsMax {
			delete(bt.suspects, bt.order[0])
			bt.order = bt.order[1:]
		}
		bt.suspects[k] = struct{}{}
		bt.order = append(bt.order, k)
	}
}

// cleared reports whether key may join a batch, and forgets it as a
// suspect: it runs alone once.
func (bt *batcher) cleared(key string) bool {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if _, ok := bt.suspects[key]; !ok {
		return true
	}
	delete(bt.suspects, key)
	if i := slices.Index(bt.order, key); i >= 0 {
		bt.order = slices.Delete(bt.order, i, i+1)
	}
	return false
}
