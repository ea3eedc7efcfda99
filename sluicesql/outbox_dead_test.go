package sluicesql_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/sluicesql"
)

// A table of the version before dead_at: CreateTable adds the column (its
// rows kept), and a row the relay sets aside as dead is taken no more,
// leaves the pending count and the oldest age, and comes back on Requeue;
// Discard deletes only dead rows. On every backend the store speaks.
func TestCreateTableMigratesAndDeadRowsAreSetAside(t *testing.T) {
	t.Parallel()
	for name, s := range backends(t) {
		t.Run(name, func(t *testing.T) {
			d := db(t, s)
			_, err := d.Exec(`ALTER TABLE ` + quoted(s) + ` DROP COLUMN dead_at`)
			require.NoError(t, err)
			write(t, s, "t", message.NewMessage("old-1", nil), message.NewMessage("old-2", nil))
			require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), s), "migrates the earlier table")
			require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), s), "idempotent")

			b, err := s.Due(t.Context(), 10, 0)
			require.NoError(t, err)
			rows := b.Rows()
			require.Len(t, rows, 2, "the rows kept")
			require.NoError(t, b.Finish(t.Context(), nil, []outbox.Failed{
				{ID: rows[0].ID, Err: "refused: 406 PRECONDITION_FAILED", Dead: true},
				{ID: rows[1].ID, Err: "uncertain", NextAttempt: time.Now()},
			}))
			st, err := s.Stats(t.Context())
			require.NoError(t, err)
			require.Equal(t, outbox.Stats{Pending: 1, Failing: 1, Dead: 1}, outbox.Stats{Pending: st.Pending, Failing: st.Failing, Dead: st.Dead})
			require.Eventually(t, func() bool {
				b, err := s.Due(t.Context(), 10, 0)
				require.NoError(t, err)
				defer func() { require.NoError(t, b.Release(t.Context())) }()
				return len(b.Rows()) == 1 && b.Rows()[0].ID == rows[1].ID
			}, time.Minute, 10*time.Millisecond, "the dead row is not taken")
			dead, err := s.List(t.Context(), sluicesql.OutboxDead, 10)
			require.NoError(t, err)
			require.Len(t, dead, 1)
			require.Equal(t, "refused: 406 PRECONDITION_FAILED", dead[0].LastError)
			require.False(t, dead[0].DeadAt.IsZero())

			gone, err := s.Discard(t.Context(), []int64{rows[1].ID})
			require.NoError(t, err)
			require.Empty(t, gone, "a pending row is never discarded")
			back, err := s.Requeue(t.Context(), nil)
			require.NoError(t, err)
			require.Equal(t, []sluicesql.OutboxEntry{{ID: rows[0].ID, Topic: "t", MessageID: "old-1", EventID: "old-1"}}, back)
			st, err = s.Stats(t.Context())
			require.NoError(t, err)
			require.Equal(t, int64(2), st.Pending)
			require.Zero(t, st.Dead)
		})
	}
}

func quoted(s *sluicesql.Outbox) string {
	if p := prefix(s); p != "" {
		return p + `"outbox"`
	}
	return `"sluice_outbox"`
}
