package ordering

import (
	"context"
	"errors"
	"time"
)

// Store keeps, per (consumer, key), the key's head — the delivery whose copy
// waits in a retry tier or the poison queue — and the messages held behind
// it, in the order they arrived. An implementation must pass
// orderingtest.Run.
type Store interface {
	// Lock opens the unit of work of one key. While it is open no other
	// Lock of the same (consumer, key) returns: it waits, at most the
	// store's own bound (then an error), or until ctx ends. A Lock that
	// ctx ended may still take the key for a moment after it returned,
	// until the store has given the abandoned wait up (sqlstore's rolls
	// its transaction back once the database answers): Releasable skips
	// the key meanwhile, and the next poll finds it.
	Lock(ctx context.Context, consumer, key string) (Guard, error)
	// Releasable returns up to limit keys of consumer whose head is done
	// (Guard.Unblock) but that still hold messages — a release a crash, a
	// shutdown or a failure interrupted — skipping keys another unit of work
	// holds.
	Releasable(ctx context.Context, consumer string, limit int) ([]string, error)
	// Keys returns up to limit waiting keys of consumer, the oldest first,
	// with how many messages each holds (for operators: sluice order list).
	Keys(ctx context.Context, consumer string, limit int) ([]Key, error)
	// Stats counts the waiting keys of consumer.
	Stats(ctx context.Context, consumer string) (Stats, error)
	// Waits tells, in one round trip and without a unit of work, whether
	// a key waits: the stage then locks only the keys that do (most
	// deliveries' keys do not). It is enough because a key that does not
	// wait changes only through its own deliveries, which run one at a
	// time. A store that cannot tell so cheaply returns true: the stage
	// then locks every key.
	Waits(ctx context.Context, consumer, key string) (bool, error)
}

// Guard is the unit of work of one key, locked by Store.Lock until Commit or
// Rollback. It is used by one goroutine at a time.
type Guard interface {
	// State returns the key's state; false when the key does not wait.
	State(ctx context.Context) (Key, bool, error)
	// Hold appends m behind the key's head, once per event id: holding an
	// event id the key already holds changes nothing.
	Hold(ctx context.Context, m Held) error
	// Block makes head the key's head (the key waits for it), creating the
	// key's state when it has none.
	Block(ctx context.Context, head string, poisoned bool, reason string) error
	// Unblock records that the key's head is done: the key releases what it
	// holds. A key that holds nothing any more is removed.
	Unblock(ctx context.Context) error
	// Next returns the oldest message the key holds; false when it holds none.
	Next(ctx context.Context) (Held, bool, error)
	// Remove removes the held message with the event id.
	Remove(ctx context.Context, eventID string) error
	Commit(ctx context.Context) error
	// Rollback does nothing after Commit, so it can be deferred.
	Rollback(ctx context.Context) error
}

// Key is a waiting key: its head, what became of it, and what it holds.
type Key struct {
	Key string
	// Head is the event id of the delivery the key waits for; empty while
	// the key releases what it holds (its head is done).
	Head string
	// Poisoned: the head is in the poison queue; the key waits until an
	// operator replays the head (it is then the head again) or skips it.
	Poisoned bool
	// Reason is the head's failure, bounded and redacted.
	Reason string
	// Since is when the key began to wait.
	Since time.Time
	// Held is how many messages the key holds (Store.Keys only).
	Held int
}

// Held is a message held behind its key's head.
type Held struct {
	EventID  string
	UUID     string
	Payload  []byte
	Metadata map[string]string
	HeldAt   time.Time
}

// Stats counts the waiting keys of a consumer.
type Stats struct {
	Blocked   int       // keys waiting for a head in a retry tier
	Poisoned  int       // keys waiting for a head in the poison queue
	Releasing int       // keys whose head is done and whose release is unfinished
	Held      int       // messages held behind them
	Oldest    time.Time // when the oldest waiting key began to wait; zero when none
}

var (
	errNotWaiting = errors.New("ordering: Hold on a key that does not wait")
	errGuardDone  = errors.New("ordering: the key's unit of work has ended")
)
