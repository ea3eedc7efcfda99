package sluicesql_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

// waitForALockWait returns once a statement on schema's tables waits on a
// lock (a claim behind another delivery's claim of the same key).
func waitForALockWait(t *testing.T, db *sqlx.DB, schema string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, schema))
		return n > 0
	}, 2*time.Minute, 5*time.Millisecond)
}

// A rejection after a statement that aborted its transaction records its
// claim alone in a new one — unless a redelivery of the same key processed
// it in between (PostgreSQL ends the transaction, and its claim, at the
// failed statement, though the handler goes on): then the rejection is a
// duplicate and what it produced is not written. Found by a probe: both
// deliveries' events were in the outbox for one key.
func TestARejectionAfterAnAbortYieldsToARedeliveryThatProcessedTheKey(t *testing.T) {
	t.Parallel()
	for name, batch := range map[string]*deduplication.BatchConfig{"one transaction per delivery": nil, "group commit": {MaxBatch: 1}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testenv.Postgres(t)
			schema := testenv.Schema(t, db)
			in := testenv.SQLStore(t, db, schema+".inbox")
			ob, err := sluicesql.NewOutbox(db, sluicesql.OutboxConfig{Table: schema + ".outbox"})
			require.NoError(t, err)
			require.NoError(t, sluicesql.CreateOutboxTable(t.Context(), ob))
			_, err = db.Exec(`CREATE TABLE ` + schema + `.orders (k TEXT PRIMARY KEY); INSERT INTO ` + schema + `.orders VALUES ('taken')`)
			require.NoError(t, err)
			stage, err := deduplication.New(deduplication.Config{Store: in, Consumer: "c", Batch: batch})
			require.NoError(t, err)
			deliver := func(h message.HandlerFunc) error {
				msg := message.NewMessage(watermill.NewUUID(), nil)
				msg.Metadata.Set(sluice.EventIDKey, "order-1")
				msg.SetContext(context.Background())
				_, err := stage(h)(msg)
				return err
			}
			aborted, releaseA := make(chan struct{}), make(chan struct{})
			running, releaseB := make(chan struct{}), make(chan struct{})
			var wg sync.WaitGroup
			var errA, errB error
			wg.Go(func() {
				errA = deliver(func(msg *message.Message) ([]*message.Message, error) {
					ctx := msg.Context()
					if err := ob.Publish(ctx, "t", message.NewMessage("A-rejected", nil)); err != nil {
						return nil, err
					}
					_, err := sluicesql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO `+schema+`.orders VALUES ('taken')`)
					require.Error(t, err)
					close(aborted)
					<-releaseA
					return nil, sluice.Reject(fmt.Errorf("already taken: %w", err))
				})
			})
			<-aborted
			wg.Go(func() {
				errB = deliver(func(msg *message.Message) ([]*message.Message, error) {
					close(running)
					<-releaseB
					return nil, ob.Publish(msg.Context(), "t", message.NewMessage("B-processed", nil))
				})
			})
			<-running // PostgreSQL ended A's transaction at its failed statement: B claimed
			close(releaseA)
			waitForALockWait(t, db, schema) // A's claim alone waits on B's
			close(releaseB)
			wg.Wait()
			require.NoError(t, errA, "a duplicate once B committed")
			require.NoError(t, errB)
			var ids []string
			require.NoError(t, db.Select(&ids, `SELECT message_id FROM `+schema+`.outbox`))
			require.Equal(t, []string{"B-processed"}, ids, "one outcome for the key")
		})
	}
}
