package sluicesql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

func TestNewPrunerValidates(t *testing.T) {
	t.Parallel()
	store := deduplication.NewMemoryStore()
	ladder := []time.Duration{30 * time.Second, 5 * time.Minute, 30 * time.Minute}
	for _, tt := range []struct {
		cfg  sluicesql.PrunerConfig
		want string
	}{
		{sluicesql.PrunerConfig{}, "PrunerConfig.Store is required"},
		{sluicesql.PrunerConfig{Store: store, Retention: time.Hour, RetryDelays: ladder, ReplayWindow: 24 * time.Hour},
			"PrunerConfig.Retention (1h0m0s) must cover the retry ladder (RetryDelays, 35m30s) plus PrunerConfig.ReplayWindow (24h0m0s)"},
		{sluicesql.PrunerConfig{Store: store, RetryDelays: []time.Duration{0}}, "PrunerConfig.RetryDelays[0]"},
		{sluicesql.PrunerBatches(sluicesql.PrunerConfig{Store: store}, -1, 0), "must not be negative"},
	} {
		_, err := sluicesql.NewPruner(tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
	_, err := sluicesql.NewPruner(sluicesql.PrunerConfig{Store: store, Retention: 25 * time.Hour, RetryDelays: ladder, ReplayWindow: 24 * time.Hour})
	require.NoError(t, err)
}

func TestPrunerDeletesOldRowsInBatches(t *testing.T) {
	t.Parallel()
	db, schema, store := withOldRows(t, 250) // and 10 just now:
	for i := range 10 {
		require.True(t, claimCommitted(t, store, fmt.Sprint("new-", i)))
	}

	p, err := sluicesql.NewPruner(sluicesql.PrunerBatches(sluicesql.PrunerConfig{Store: store, Retention: 24 * time.Hour}, 100, time.Millisecond))
	require.NoError(t, err)
	n, err := p.Prune(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(250), n)

	var left int
	require.NoError(t, db.Get(&left, fmt.Sprintf(`SELECT count(*) FROM %s.inbox`, schema)))
	require.Equal(t, 10, left, "rows within the retention stay")
}

func TestPrunerStartClose(t *testing.T) {
	t.Parallel()
	db, schema, store := withOldRows(t, 30)

	p, err := sluicesql.NewPruner(sluicesql.PrunerBatches(sluicesql.PrunerConfig{Store: store, Retention: 24 * time.Hour, Interval: 10 * time.Millisecond}, 7, 0))
	require.NoError(t, err)
	require.NoError(t, p.Close(), "Close before Start")
	require.NoError(t, p.Start(context.Background()))
	require.ErrorContains(t, p.Start(context.Background()), "already started")
	require.Eventually(t, func() bool {
		var left int
		return db.Get(&left, fmt.Sprintf(`SELECT count(*) FROM %s.inbox`, schema)) == nil && left == 0
	}, time.Minute, 10*time.Millisecond)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")
}

// withOldRows returns an inbox in a schema of its own holding n rows
// processed two days ago.
func withOldRows(t *testing.T, n int) (*sqlx.DB, string, *sluicesql.Inbox) {
	t.Helper()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	store := testenv.SQLStore(t, db, schema+".inbox")
	_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s.inbox SELECT 'c', 'old-' || g, now() - interval '2 days' FROM generate_series(1, $1) g`, schema), n)
	require.NoError(t, err)
	return db, schema, store
}

func claimCommitted(t *testing.T, s deduplication.Store, key string) bool {
	t.Helper()
	tx, err := s.Begin(t.Context())
	require.NoError(t, err)
	ok, err := tx.Claim(t.Context(), "c", key)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(t.Context()))
	return ok
}
