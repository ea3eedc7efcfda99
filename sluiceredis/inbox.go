package sluiceredis

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/unitofwork"
)

// The Inbox's defaults (InboxConfig).
const (
	inboxPrefixDefault    = "sluice:inbox:"
	inboxLeaseDefault     = time.Minute
	inboxRetentionDefault = 7 * 24 * time.Hour
)

// InboxConfig configures an Inbox (NewInbox).
type InboxConfig struct {
	// Prefix starts every key the store writes. Default "sluice:inbox:".
	Prefix string
	// Lease is how long a claim holds a key while its handler runs. A
	// handler that runs longer loses the key to the next delivery, and runs
	// twice. Default 1 min.
	Lease time.Duration
	// Retention is how long a processed key is remembered (its TTL); it
	// must cover the retry ladder and the replay window. Default 7
	// days.
	Retention time.Duration
}

// Inbox is the inbox's store (deduplication.Config.Store) on Redis: a
// claim is a SET NX of a pending marker with a TTL of Lease, a commit
// overwrites it with a done marker kept for Retention, a rollback deletes
// it. A concurrent claim of a pending key fails with
// deduplication.ErrClaimInProgress instead of waiting, and the delivery is
// retried. A batch handler's unit of work claims its batch's keys in one
// round trip and commits them in another (deduplication.BatchClaimer).
//
// It cannot join the business transaction, so its guarantee is weaker than
// the SQL store's:
//   - the handler's writes and the done marker are committed separately: a
//     crash (or a failed commit) after the handler's writes and before the
//     marker lets the redelivery run the handler again, once the Lease ends;
//   - a handler slower than Lease may run concurrently with a redelivery;
//   - a Redis that loses data (no persistence, a failover to a lagging
//     replica, eviction under maxmemory) forgets processed keys.
//
// Use it where effects are idempotent themselves or live outside a SQL
// database, and the SQL store wherever the effects are SQL writes. It is
// safe for concurrent use.
type Inbox struct {
	client    redis.UniversalClient
	prefix    string
	lease     time.Duration
	retention time.Duration
}

var _ deduplication.Store = (*Inbox)(nil)

// withDefaults returns a copy of c with its defaults filled.
func (c InboxConfig) withDefaults() InboxConfig {
	c.Prefix = cmp.Or(c.Prefix, inboxPrefixDefault)
	c.Lease = cmp.Or(c.Lease, inboxLeaseDefault)
	c.Retention = cmp.Or(c.Retention, inboxRetentionDefault)
	return c
}

// validate checks an InboxConfig with its defaults filled.
func (c InboxConfig) validate() error {
	switch {
	case c.Lease < time.Millisecond:
		return fmt.Errorf("sluiceredis: InboxConfig.Lease must be at least 1ms, got %s", c.Lease)
	case c.Retention < c.Lease:
		return fmt.Errorf("sluiceredis: InboxConfig.Retention (%s) must be at least InboxConfig.Lease (%s)", c.Retention, c.Lease)
	}
	return nil
}

// NewInbox validates cfg and returns the inbox on client.
func NewInbox(client redis.UniversalClient, cfg InboxConfig) (*Inbox, error) {
	if client == nil {
		return nil, errors.New("sluiceredis: NewInbox: the client is required")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Inbox{
		client:    client,
		prefix:    cfg.Prefix,
		lease:     cfg.Lease,
		retention: cfg.Retention,
	}, nil
}

// Begin starts a unit of work; it does not talk to Redis.
func (s *Inbox) Begin(context.Context) (unitofwork.Tx, error) { return &redisTx{s: s}, nil }

// redisKey length-prefixes the consumer so that ("a:b","c") and ("a","b:c")
// never share a key.
func (s *Inbox) redisKey(consumer, key string) string {
	return s.prefix + strconv.Itoa(len(consumer)) + ":" + consumer + ":" + key
}

const redisDone = "done"

// claimScript: 1 claimed (or claimed already by this unit of work's token:
// a pipeline go-redis sent again after a read error or timeout), 0 already
// done, 2 pending elsewhere.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local v = redis.call('GET', KEYS[1])
if v == 'done' then return 0 end
if v == ARGV[1] then return 1 end
return 2`)

// releaseScript deletes the key only while this unit of work's marker holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

type redisTx struct {
	s     *Inbox
	keys  []string // the Redis keys this unit of work claimed
	token string   // its pending marker
	used  bool     // Claim or ClaimBatch was called
	ended bool
}

var _ deduplication.ClaimReleaser = (*redisTx)(nil)

// begin checks that the unit of work may claim, and gives it its marker.
func (t *redisTx) begin() error {
	if t.ended || t.used {
		return errors.New("sluiceredis: Claim or ClaimBatch called twice or after the unit of work ended")
	}
	t.used = true
	var b [16]byte
	_, _ = rand.Read(b[:])
	t.token = "pending:" + hex.EncodeToString(b[:])
	return nil
}

func (t *redisTx) Claim(ctx context.Context, consumer, key string) (bool, error) {
	if err := t.begin(); err != nil {
		return false, err
	}
	k := t.s.redisKey(consumer, key)
	res, err := claimScript.Run(ctx, t.s.client, []string{k}, t.token, t.s.lease.Milliseconds()).Int()
	if err != nil {
		return false, err
	}
	switch res {
	case 1:
		t.keys = []string{k}
		return true, nil
	case 0:
		return false, nil
	default:
		return false, deduplication.ErrClaimInProgress
	}
}

// ClaimBatch claims keys (distinct) in one round trip to Redis — a pipeline
// of the claim script, one per key, each key's claim atomic — and returns
// those it claimed (deduplication.BatchClaimer: a batch handler's claim); a
// key recorded as done is left out. The store does not wait: a key another
// unit of work holds fails the call at once with an error matching
// deduplication.ErrClaimInProgress (wait does not apply; nor does idle, a
// claim holding its key for Lease), and Rollback releases the keys the call
// claimed. A failed round trip may have claimed some keys: Rollback
// releases whichever this unit of work holds.
func (t *redisTx) ClaimBatch(ctx context.Context, consumer string, keys []string, _, _ time.Duration) ([]string, error) {
	if err := t.begin(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, nil
	}
	rkeys := make([]string, len(keys))
	for i, k := range keys {
		rkeys[i] = t.s.redisKey(consumer, k)
	}
	// Rollback releases whichever of them this unit of work holds (by its
	// token), whatever the round trip's outcome.
	t.keys = rkeys
	res, err := t.s.evalEach(ctx, claimScript, rkeys, t.token, t.s.lease.Milliseconds())
	if err != nil {
		return nil, err
	}
	claimed := make([]string, 0, len(keys))
	mine := rkeys[:0:0]
	held := 0
	for i, r := range res {
		switch r {
		case 1:
			claimed = append(claimed, keys[i])
			mine = append(mine, rkeys[i])
		case 2:
			held++
		}
	}
	if held > 0 {
		return nil, fmt.Errorf("%w: %d of the batch's %d keys are held by other units of work", deduplication.ErrClaimInProgress, held, len(keys))
	}
	t.keys = mine
	return claimed, nil
}

// ReleaseClaims gives back the claims of keys this unit of work holds
// (deduplication.ClaimReleaser: a batch handler's failed events), in one
// round trip; the commit records the others.
func (t *redisTx) ReleaseClaims(ctx context.Context, consumer string, keys []string) error {
	if t.ended {
		return errors.New("sluiceredis: redis unit of work already ended")
	}
	if len(keys) == 0 {
		return nil
	}
	gone := make(map[string]bool, len(keys))
	rkeys := make([]string, len(keys))
	for i, k := range keys {
		rkeys[i] = t.s.redisKey(consumer, k)
		gone[rkeys[i]] = true
	}
	if _, err := t.s.evalEach(ctx, releaseScript, rkeys, t.token); err != nil {
		return err
	}
	t.keys = slices.DeleteFunc(t.keys, func(k string) bool { return gone[k] })
	return nil
}

// evalEach runs script once for each of keys, with args, in one pipeline,
// and returns each run's integer reply. The script is sent by its hash; a
// Redis that does not have it (NOSCRIPT: restarted, flushed, another node
// of a cluster) is sent its source for the runs that failed so.
func (s *Inbox) evalEach(ctx context.Context, script *redis.Script, keys []string, args ...any) ([]int64, error) {
	cmds := make([]*redis.Cmd, len(keys))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = script.EvalSha(ctx, p, []string{k}, args...)
		}
		return nil
	})
	if err != nil && !redis.HasErrorPrefix(err, "NOSCRIPT") {
		return nil, err
	}
	var again []int
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		if _, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				cmds[i] = script.Eval(ctx, p, []string{keys[i]}, args...)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	res := make([]int64, len(cmds))
	for i, c := range cmds {
		n, err := c.Int64()
		if err != nil {
			return nil, err
		}
		res[i] = n
	}
	return res, nil
}

// Commit records the keys as done for Retention, even if the lease ran
// out: the handler's effects have happened. A batch's keys are written in
// one pipeline: not a MULTI/EXEC, which a Redis Cluster refuses for keys of
// several hash slots (CROSSSLOT). A commit cut short records some of them:
// the others stay pending until their Lease ends, and their events run
// again, as after any failed commit.
func (t *redisTx) Commit(ctx context.Context) error {
	if t.ended {
		return errors.New("sluiceredis: redis unit of work already ended")
	}
	t.ended = true
	if len(t.keys) == 0 {
		return nil
	}
	_, err := t.s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range t.keys {
			p.Set(ctx, k, redisDone, t.s.retention)
		}
		return nil
	})
	return err
}

// Rollback releases the keys this unit of work still holds (marked with its
// token): a key whose lease ran out and that another claimed is left alone.
func (t *redisTx) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	if len(t.keys) == 0 {
		return nil
	}
	_, err := t.s.evalEach(ctx, releaseScript, t.keys, t.token)
	return err
}
