// Package sluiceredis holds Sluice's stores on Redis: the replay stage's
// outcome records (Outcomes).
package sluiceredis

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

// outcomesPrefixDefault is OutcomesConfig.Prefix's default: the outcome
// table's default name and a colon, as `sluice dlq --outcomes redis://…`
// reads it by default (its --outcomes-table is the prefix without the
// colon).
const outcomesPrefixDefault = ledger.TableDefault + ":"

// OutcomesConfig configures NewOutcomes. Every field is optional.
type OutcomesConfig struct {
	// Prefix starts every key the store writes: <Prefix>runs, a set of the
	// run ids, and <Prefix>run:<run>, a hash of the run's records by item.
	// On Redis Cluster give it a hash tag ("{sluice_replay}:") so that
	// both keys of a record are in one slot. Default "sluice_replay:"
	// (ledger.TableDefault and a colon).
	Prefix string
	// Retention, when set, is how long a run's records are kept after its
	// last record (the keys' TTL). Default 0: kept until deleted — the
	// outcome records are the record that lasts.
	Retention time.Duration
}

// Outcomes keeps the replay stage's outcome records on Redis, for services
// whose inbox is on Redis (Inbox) and that have no SQL
// database to hold the outcome table; `sluice dlq replay`, `report`,
// `resolve`, `archive` and `discard` read and write it with --outcomes
// redis://…. It is a replay.Store and a ledger.Ledger: a hash per run, one
// field per item holding the record as JSON. A record is written by a
// script, so that "duplicate" never replaces "processed" or "rejected" even
// when two consumers record one item at once. Unlike sluicesql.Outcomes it
// cannot write "processed" in the inbox's transaction (Redis has none to
// join): outcomes are recorded after the stack returns, at least once.
// Safe for concurrent use.
type Outcomes struct {
	client    redis.UniversalClient
	prefix    string
	retention time.Duration
}

var _ ledger.Ledger = (*Outcomes)(nil)

// NewOutcomes validates cfg and returns the outcome records on client.
func NewOutcomes(client redis.UniversalClient, cfg OutcomesConfig) (*Outcomes, error) {
	if client == nil {
		return nil, errors.New("sluiceredis: NewOutcomes: the client is required")
	}
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("sluiceredis: OutcomesConfig.Retention %s: want 0 (keep) or more", cfg.Retention)
	}
	return &Outcomes{client: client, prefix: cmp.Or(cfg.Prefix, outcomesPrefixDefault), retention: cfg.Retention}, nil
}

func (s *Outcomes) runsKey() string          { return s.prefix + "runs" }
func (s *Outcomes) runKey(run string) string { return s.prefix + "run:" + run }

// record writes ARGV[2] (a record as JSON) to field ARGV[1] of the run's
// hash KEYS[1] and adds the run (ARGV[4]) to the set KEYS[2]. ARGV[3] is
// the mode: "upsert" (the stage's Record: a duplicate does not replace a
// processed or rejected record), "insert" (the CLI's Replayed: only where
// nothing is yet) or "replace" (the operator's records). ARGV[5] is the
// retention in milliseconds (0: none).
//
//go:embed outcomes_record.lua
var outcomesRecordScript string

var outcomesRecord = redis.NewScript(outcomesRecordScript)

func (s *Outcomes) write(ctx context.Context, mode string, r replay.Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return outcomesRecord.Run(ctx, s.client, []string{s.runKey(r.Run), s.runsKey()},
		r.Item, b, mode, r.Run, s.retention.Milliseconds()).Err()
}

// Record upserts r by the stage's rule, as sluicesql.Outcomes': nothing
// replaces "processed" or "rejected", and only those replace "duplicate".
func (s *Outcomes) Record(ctx context.Context, r replay.Record) error {
	return s.write(ctx, "upsert", r)
}

// Replayed records that the CLI sent items of run, unless an outcome for
// them is already there.
func (s *Outcomes) Replayed(ctx context.Context, rs []replay.Record) error {
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
func (s *Outcomes) Records(ctx context.Context, rs []replay.Record) error {
	for _, r := range rs {
		if err := s.write(ctx, "replace", r); err != nil {
			return err
		}
	}
	return nil
}

// Items returns the records of run's items given, those there are.
func (s *Outcomes) Items(ctx context.Context, run string, items []string) ([]replay.Record, error) {
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
				return fmt.Errorf("sluiceredis: outcomes: run %q item %q: %w", run, chunk[i], err)
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}

// Outcomes returns the records of run, or of every run when run is empty,
// ordered by run and item.
func (s *Outcomes) Outcomes(ctx context.Context, run string) ([]replay.Record, error) {
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
				return nil, fmt.Errorf("sluiceredis: outcomes: run %q item %q: %w", r, item, err)
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

var _ ledger.Runs = (*Outcomes)(nil)

// The runs' keys: <Prefix>runrec:<id>, the run as JSON, and <Prefix>runlist,
// a sorted set of the run ids by the time they started.
func (s *Outcomes) runRecKey(id string) string { return s.prefix + "runrec:" + id }
func (s *Outcomes) runListKey() string         { return s.prefix + "runlist" }

// SaveRun inserts or replaces the run of r.ID, kept as long as the records
// (OutcomesConfig.Retention).
func (s *Outcomes) SaveRun(ctx context.Context, r ledger.Run) error {
	b, err := replayledger.MarshalRun(r)
	if err != nil {
		return err
	}
	_, err = s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, s.runRecKey(r.ID), b, s.retention)
		p.ZAdd(ctx, s.runListKey(), redis.Z{Score: float64(r.Started.UnixMilli()), Member: r.ID})
		return nil
	})
	return err
}

// Run returns the run of id.
func (s *Outcomes) Run(ctx context.Context, id string) (ledger.Run, bool, error) {
	b, err := s.client.Get(ctx, s.runRecKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return ledger.Run{}, false, nil
	}
	if err != nil {
		return ledger.Run{}, false, err
	}
	r, err := replayledger.UnmarshalRun(id, b)
	return r, err == nil, err
}

// RecentRuns returns the limit runs started last, newest first; a run whose
// record expired (OutcomesConfig.Retention) is forgotten.
func (s *Outcomes) RecentRuns(ctx context.Context, limit int) ([]ledger.Run, error) {
	ids, err := s.client.ZRevRange(ctx, s.runListKey(), 0, int64(limit)-1).Result()
	if err != nil {
		return nil, err
	}
	var out []ledger.Run
	for _, id := range ids {
		r, ok, err := s.Run(ctx, id)
		if err != nil {
			return nil, err
		}
		if !ok {
			_ = s.client.ZRem(ctx, s.runListKey(), id).Err()
			continue
		}
		out = append(out, r)
	}
	return out, nil
}
