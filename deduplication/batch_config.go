package deduplication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicemq/sluice/unitofwork"
)

// Defaults of BatchConfig (group commit).
const (
	// maxBatchDefault is BatchConfig.MaxBatch's default: the most
	// deliveries one commit takes.
	maxBatchDefault = 8
	// maxWaitDefault is BatchConfig.MaxWait's default: the longest a batch
	// waits for more deliveries after its first.
	maxWaitDefault = 2 * time.Millisecond
)

// queueTimeoutDefault is BatchConfig.QueueTimeout's default.
const queueTimeoutDefault = 50 * time.Millisecond

// BatchConfig turns on group commit (Config.Batch): deliveries in flight on
// one handler share one transaction. Each one's claim and handler run inside
// a SAVEPOINT of their own, one delivery after another on the shared
// transaction; the transaction commits once; each delivery returns — is
// acked — only after that commit. A delivery that fails rolls back to its
// savepoint (its claim and writes vanish; its error goes outward as without
// batching) and returns at once; the others commit. A failed commit fails
// every delivery that waited for it as Transient. The handler's API does not
// change: unitofwork.FromContext (sluicesql.TxFromContext) gives the shared
// transaction, positioned at the delivery's savepoint.
//
// A store whose units of work are not Savepointers (Redis, MemoryStore)
// runs one unit of work per delivery, as without batching.
type BatchConfig struct {
	// MaxBatch is the most deliveries one transaction commits. A batch's
	// deliveries run one after another on one connection, so the batches of
	// a handler run side by side only when more deliveries are in flight
	// than one batch takes: give the consumer a prefetch of several times
	// MaxBatch (rabbitmq.BrokerConfig.Prefetch; docs/benchmarks.md, P8).
	// Default 8.
	MaxBatch int
	// MaxWait is the longest a batch takes in deliveries after its first.
	// A batch closes sooner when it is full, or — unless Linger — when
	// every delivery it took in is done and none waits for its turn: a lone
	// delivery commits once its handler returned, and a batch carries the
	// deliveries that arrived while the ones before them ran. Default
	// 2 ms.
	MaxWait time.Duration
	// Linger keeps a batch taking in deliveries for the whole MaxWait, even
	// once the ones it took in are done: fewer, larger commits when
	// deliveries trickle in, each delivery waiting up to MaxWait for
	// company before its commit.
	Linger bool
	// QueueTimeout bounds how long a delivery waits for its turn in a batch
	// (the handler before it still running): past it, it leaves the batch
	// and runs in a unit of work of its own. A slow handler so holds up only
	// the deliveries that ran before it in its batch (their commit waits for
	// it: bound it with the handler's own deadline), never those queued
	// after it. Default 50 ms.
	QueueTimeout time.Duration
}

func (c BatchConfig) withDefaults() BatchConfig {
	c.MaxBatch = cmp.Or(c.MaxBatch, maxBatchDefault)
	c.MaxWait = cmp.Or(c.MaxWait, maxWaitDefault)
	c.QueueTimeout = cmp.Or(c.QueueTimeout, queueTimeoutDefault)
	return c
}

func (c BatchConfig) validate() error {
	switch {
	case c.MaxBatch < 1 || c.MaxBatch > 1000:
		return fmt.Errorf("deduplication: Config.Batch.MaxBatch must be between 1 and 1000, got %d", c.MaxBatch)
	case c.MaxWait < 0 || c.MaxWait > time.Second:
		return fmt.Errorf("deduplication: Config.Batch.MaxWait must be between 0 and 1s, got %s", c.MaxWait)
	case c.QueueTimeout < 0:
		return fmt.Errorf("deduplication: Config.Batch.QueueTimeout must not be negative, got %s", c.QueueTimeout)
	}
	return nil
}

// savepointClaimer is a unitofwork.Savepointer that can, in one round trip, release
// the savepoint of the delivery before (release, "" for none), set the
// next delivery's savepoint and claim its key after it: the SQL store on
// lib/pq. Group commit uses it where the store offers it, and then releases
// a successful delivery's savepoint together with the next one's claim.
// When the transaction was aborted before the call (by the handler of the
// delivery before), its error matches unitofwork.ErrAborted and nothing was done.
//
// wait bounds the claim's wait for a concurrent claim of the same key
// (ClaimTimeout; 0: none) — where the store can, without cancelling ctx, as
// cancelling a statement may end the connection, the whole batch's. A claim
// that waited longer fails with an error matching ErrClaimInProgress. ctx
// is not cancelled by the inbox while the claim runs.
type savepointClaimer interface {
	unitofwork.Savepointer
	ClaimAfter(ctx context.Context, release, savepoint, consumer, key string, wait time.Duration) (bool, error)
}

// batchClaimWait is how long a batched claim waits for another
// transaction's claim of the same key before its delivery leaves the batch.
const batchClaimWait = time.Millisecond

// errNoSavepoints marks a store whose units of work cannot batch.
var errNoSavepoints = errors.New("deduplication: the store's units of work are no Savepointers")
