package sluiceredis_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluiceredis"
)

// BenchmarkInboxClaims: the Redis inbox's claims and commits per event, one
// unit of work per event (a Handler, or a batch handler before the inbox's
// units of work claimed many keys) against one unit of work per batch of 64
// (ClaimBatch: one round trip to claim, one to commit). ns/op is per event.
//
//	go test -run '^$' -bench BenchmarkInboxClaims ./sluiceredis/
func BenchmarkInboxClaims(b *testing.B) {
	client, prefix := testenv.Redis(b)
	store, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix})
	require.NoError(b, err)
	ctx := context.Background()
	run := 0
	for _, size := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			run++
			keys := make([]string, size)
			for i := 0; b.Loop(); i++ {
				for j := range keys {
					keys[j] = fmt.Sprintf("r%d-e%d", run, i*size+j)
				}
				tx, err := store.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if size == 1 {
					if _, err := tx.Claim(ctx, "bench", keys[0]); err != nil {
						b.Fatal(err)
					}
				} else if _, err := tx.(deduplication.BatchClaimer).ClaimBatch(ctx, "bench", keys, 0, 0); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/event")
		})
	}
}
