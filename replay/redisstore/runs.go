package redisstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay/ledger"
)

var _ ledger.Runs = (*Store)(nil)

// The runs' keys: <Prefix>runrec:<id>, the run as JSON, and <Prefix>runlist,
// a sorted set of the run ids by the time they started.
func (s *Store) runRecKey(id string) string { return s.prefix + "runrec:" + id }
func (s *Store) runListKey() string         { return s.prefix + "runlist" }

// SaveRun inserts or replaces the run of r.ID, kept as long as the records
// (Config.Retention).
func (s *Store) SaveRun(ctx context.Context, r ledger.Run) error {
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
func (s *Store) Run(ctx context.Context, id string) (ledger.Run, bool, error) {
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
// record expired (Config.Retention) is forgotten.
func (s *Store) RecentRuns(ctx context.Context, limit int) ([]ledger.Run, error) {
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
