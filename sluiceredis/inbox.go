package sluiceredis

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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
// retried.
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

// claimScript: 1 claimed, 0 already done, 2 pending elsewhere.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == 'done' then return 0 end
return 2`)

// releaseScript deletes the key only while this unit of work's marker holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

type redisTx struct {
	s     *Inbox
	key   string
	token string
	ended bool
}

func (t *redisTx) Claim(ctx context.Context, consumer, key string) (bool, error) {
	if t.ended || t.key != "" {
		return false, errors.New("sluiceredis: Claim called twice or after the unit of work ended")
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	token := "pending:" + hex.EncodeToString(b[:])
	k := t.s.redisKey(consumer, key)
	res, err := claimScript.Run(ctx, t.s.client, []string{k}, token, t.s.lease.Milliseconds()).Int()
	if err != nil {
		return false, err
	}
	switch res {
	case 1:
		t.key, t.token = k, token
		return true, nil
	case 0:
		return false, nil
	default:
		return false, deduplication.ErrClaimInProgress
	}
}

// Commit records the key as done for Retention, even if the lease ran out:
// the handler's effects have happened.
func (t *redisTx) Commit(ctx context.Context) error {
	if t.ended {
		return errors.New("sluiceredis: redis unit of work already ended")
	}
	t.ended = true
	if t.key == "" {
		return nil
	}
	return t.s.client.Set(ctx, t.key, redisDone, t.s.retention).Err()
}

func (t *redisTx) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	if t.key == "" {
		return nil
	}
	return releaseScript.Run(ctx, t.s.client, []string{t.key}, t.token).Err()
}
