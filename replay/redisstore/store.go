// Package redisstore keeps the replay stage's outcome records on Redis, for
// services whose inbox is on Redis (sluiceredis.Inbox) and that have
// no SQL database to hold the outcome table. `sluice dlq replay`, `report`,
// `resolve`, `archive` and `discard` read and write it with
// --outcomes redis://….
package redisstore

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicemq/sluice/internal/chunks"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// PrefixDefault starts every key the store writes: the outcome table's
// default name and a colon, as `sluice dlq --outcomes redis://…` reads it
// by default (its --outcomes-table is the prefix without the colon).
const PrefixDefault = ledger.TableDefault + ":"

// Config configures a Store.
type Config struct {
	// Client is the Redis client. Required.
	Client redis.UniversalClient
	// Prefix starts every key the store writes: <Prefix>runs, a set of the
	// run ids, and <Prefix>run:<run>, a hash of the run's records by item.
	// On Redis Cluster give it a hash tag ("{sluice_replay}:") so that
	// both keys of a record are in one slot. Default PrefixDefault.
	Prefix string
	// Retention, when set, is how long a run's records are kept after its
	// last record (the keys' TTL). Default 0: kept until deleted — the
	// outcome records are the record that lasts.
	Retention time.Duration
}

// Store is a replay.Store on Redis: a hash per run, one field per item
// holding the record as JSON. A record is written by a script, so that
// "duplicate" never replaces "processed" or "rejected" even when two
// consumers record one item at once. Unlike replay/sqlstore's it cannot write
// "processed" in the inbox's transaction (Redis has none to join): outcomes
// are recorded after the stack returns, at least once. Safe for concurrent
// use.
type Store struct {
	client    redis.UniversalClient
	prefix    string
	retention time.Duration
}

var _ ledger.Ledger = (*Store)(nil)

// withDefaults returns a copy of c with its defaults filled. Retention
// has none: 0 keeps the records.
func (c Config) withDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, PrefixDefault)
	return c
}

// New validates cfg and returns a Store.
func New(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if cfg.Client == nil {
		return nil, errors.New("replay/redisstore: Config.Client is required")
	}
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("replay/redisstore: Config.Retention %s: want 0 (keep) or more", cfg.Retention)
	}
	return &Store{client: cfg.Client, prefix: cfg.Prefix, retention: cfg.Retention}, nil
}

func (s *Store) runsKey() string          { return s.prefix + "runs" }
func (s *Store) runKey(run string) string { return s.prefix + "run:" + run }

// record writes ARGV[2] (a record as JSON) to field ARGV[1] of the run's
// hash KEYS[1] and adds the run (ARGV[4]) to the set KEYS[2]. ARGV[3] is
// the mode: "upsert" (the stage's Record: a duplicate does not replace a
// processed or rejected record), "insert" (the CLI's Replayed: only where
// nothing is yet) or "replace" (the operator's records). ARGV[5] is the
// retention in milliseconds (0: none).
//
//go:embed record.lua
var recordScript string

var record = redis.NewScript(recordScript)

func (s *Store) write(ctx context.Context, mode string, r replay.Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return record.Run(ctx, s.client, []string{s.runKey(r.Run), s.runsKey()},
		r.Item, b, mode, r.Run, s.retention.Milliseconds()).Err()
}

// Record upserts r by the stage's rule, as replay/sqlstore's: nothing
// replaces "processed" or "rejected", and only those replace "duplicate".
func (s *Store) Record(ctx context.Context, r replay.Record) error {
	return s.write(ctx, "upsert", r)
}

// Replayed records that the CLI sent items of run, unless an outcome for
// them is already there.
func (s *Store) Replayed(ctx context.Context, rs []replay.Record) error {
	for _, r := range rs {
		r.Outcome = ledger.OutcomeReplayed
		if err := s.write(ctx, "insert", r); err != nil {
			return err
		}
	}
	return nil
}

// Records inserts or replaces rs: the operator's records (archived,
// discarded, compensated), which replace whatever was there.
func (s *Store) Records(ctx context.Context, rs []replay.Record) error {
	for _, r := range rs {
		if err := s.write(ctx, "replace", r); err != nil {
			return err
		}
	}
	return nil
}

// Items returns the records of run's items given, those there are.
func (s *Store) Items(ctx context.Context, run string, items []string) ([]replay.Record, error) {
	var out []replay.Record
	err := chunks.Each(items, replayledger.ItemsChunk, func(chunk []string) error {
		vals, err := s.client.HMGet(ctx, s.runKey(run), chunk...).Result()
		if err != nil {
			return err
		}
		for i, v := range vals {
			str, ok := v.(string)
			if !ok { // no record of that item yet
				continue
			}
			var rec replay.Record
			if err := json.Unmarshal([]byte(str), &rec); err != nil {
				return fmt.Errorf("replay/redisstore: run %q item %q: %w", run, chunk[i], err)
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}

// Outcomes returns the records of run, or of every run when run is empty,
// ordered by run and item.
func (s *Store) Outcomes(ctx context.Context, run string) ([]replay.Record, error) {
	runs := []string{run}
	if run == "" {
		var err error
		if runs, err = s.client.SMembers(ctx, s.runsKey()).Result(); err != nil {
			return nil, err
		}
	}
	var out []replay.Record
	for _, r := range runs {
		fields, err := s.client.HGetAll(ctx, s.runKey(r)).Result()
		if err != nil {
			return nil, err
		}
		if len(fields) == 0 && run == "" { // expired (Retention): forget the run
			_ = s.client.SRem(ctx, s.runsKey(), r).Err()
		}
		for item, v := range fields {
			var rec replay.Record
			if err := json.Unmarshal([]byte(v), &rec); err != nil {
				return nil, fmt.Errorf("replay/redisstore: run %q item %q: %w", r, item, err)
			}
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b replay.Record) int {
		if c := strings.Compare(a.Run, b.Run); c != 0 {
			return c
		}
		return strings.Compare(a.Item, b.Item)
	})
	return out, nil
}
