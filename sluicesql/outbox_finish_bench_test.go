package sluicesql_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/sluicesql"
)

// BenchmarkFinishAFailedBatch records a batch of 500 failed rows on
// PostgreSQL: failed alike (an outage: one error, due again at once, no
// attempt spent), which the store records in one statement, against each
// with an error of its own, one statement a row. Per op: one batch.
//
//	go test -run '^$' -bench FinishAFailedBatch ./sluicesql/
func BenchmarkFinishAFailedBatch(b *testing.B) {
	pg := testenv.Postgres(b)
	schema := testenv.Schema(b, pg)
	s, err := sluicesql.NewOutbox(pg, sluicesql.OutboxConfig{Table: schema + ".outbox"})
	require.NoError(b, err)
	require.NoError(b, sluicesql.CreateOutboxTable(b.Context(), s))
	const rows = 500
	msgs := make([]*message.Message, rows)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprint(i), []byte("{}"))
	}
	tx, err := pg.BeginTxx(b.Context(), nil)
	require.NoError(b, err)
	require.NoError(b, s.Write(b.Context(), tx, "t", msgs...))
	require.NoError(b, tx.Commit())
	for _, each := range []bool{false, true} {
		name := "alike"
		if each {
			name = "each its own error"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				batch, err := s.Due(b.Context(), rows, 0)
				require.NoError(b, err)
				require.Len(b, batch.Rows(), rows)
				failed := make([]outbox.Failed, rows)
				now := time.Now()
				for i, r := range batch.Rows() {
					failed[i] = outbox.Failed{ID: r.ID, Err: "dial tcp: connection refused", NextAttempt: now, Uncounted: true}
					if each {
						failed[i].Err += fmt.Sprint(" ", i)
					}
				}
				b.StartTimer()
				require.NoError(b, batch.Finish(b.Context(), nil, failed))
			}
		})
	}
}
