package deduplication

import (
	"context"
	"errors"
	"time"

	"github.com/sluicemq/sluice/unitofwork"
)

// ErrClaimInProgress is returned (wrapped) by a unitofwork.Tx.Claim of a store that
// cannot wait for a concurrent claim of the same (consumer, key) to end, such
// as the Redis store. The delivery is retried later.
var ErrClaimInProgress = errors.New("deduplication: key is being processed by another delivery")

// Store records which (consumer, key) pairs have been processed. An
// implementation must pass deduplicationtest.Run.
type Store interface {
	// Begin opens the unit of work of one delivery.
	Begin(ctx context.Context) (unitofwork.Tx, error)
}

// IdleBounder is a unitofwork.Tx whose claim can also bound, in the same round trip,
// how long the unit of work may then sit idle — the handler running between
// two of its statements — before the database ends it and its locks: a
// process that hangs mid-handler (stopped, its link stalled) holds its
// claim no longer, and another process's claim of the same key (a
// redelivery, the next owner of an ordered key) goes on. The inbox stage
// claims through it when the delivery has a deadline (Watermill's Timeout
// on the router), with idle the time left to that deadline plus
// StoreTimeout, the bound of the commit that follows
// (sluicesql.Inbox's units of work on PostgreSQL).
type IdleBounder interface {
	ClaimIdle(ctx context.Context, consumer, key string, idle time.Duration) (bool, error)
}
