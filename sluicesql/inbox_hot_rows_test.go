package sluicesql_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

// Handlers that each update one of 4 hot rows (an account balance), in
// opposite orders: a batch holds every member's row locks until its
// COMMIT, so two batches touching the rows in opposite order deadlock
// (40P01). A deadlock is the batch's doing, not the delivery's: the victim
// runs again alone, at once, and no delivery fails — none would go to a
// retry tier. Before, 400 deliveries returned tens of deadlocks as
// Transient failures (the issue measured 44–52 deliveries back from a tier).
func TestGroupCommitDeadlocksOnHotRowsSpendNoAttempt(t *testing.T) {
	t.Parallel()
	base := testenv.Postgres(t)
	schema := testenv.Schema(t, base)
	_, err := base.Exec(fmt.Sprintf(`CREATE TABLE %s.accounts (id INT PRIMARY KEY, balance INT NOT NULL);
		INSERT INTO %s.accounts SELECT g, 0 FROM generate_series(0, 3) g`, schema, schema))
	require.NoError(t, err)
	// Deadlocks found in 20 ms rather than the default second (a superuser
	// setting, given at connection start): the test runs in seconds.
	u, err := url.Parse(testenv.PostgresURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("deadlock_timeout", "20ms")
	u.RawQuery = q.Encode()
	db, err := sqlx.Connect("postgres", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store := testenv.SQLStore(t, db, schema+".inbox")
	stage, err := deduplication.New(deduplication.Config{Store: store, Consumer: "ledger",
		Batch: &deduplication.BatchConfig{MaxBatch: 4, MaxWait: 20 * time.Millisecond, Linger: true, QueueTimeout: time.Second}})
	require.NoError(t, err)

	const deliveries, workers = 400, 32
	var deadlocks, failed atomic.Int64
	h := func(msg *message.Message) ([]*message.Message, error) {
		_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
			fmt.Sprintf(`UPDATE %s.accounts SET balance = balance + 1 WHERE id = $1`, schema), msg.Metadata.Get("row"))
		if state, ok := sluicesql.SQLState(err); ok && state == "40P01" {
			deadlocks.Add(1)
		}
		return nil, err
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range work {
				row := i % 4
				if (i/4)%2 == 1 { // the next four in the opposite order
					row = 3 - row
				}
				msg := message.NewMessage(fmt.Sprint(i), nil)
				msg.Metadata.Set(sluice.EventIDKey, fmt.Sprint("transfer-", i))
				msg.Metadata.Set("row", fmt.Sprint(row))
				msg.SetContext(context.Background())
				if _, err := stage(h)(msg); err != nil {
					failed.Add(1)
					t.Logf("delivery %d: %v", i, err)
				}
			}
		})
	}
	for i := range deliveries {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("%d deadlocks among %d deliveries", deadlocks.Load(), deliveries)
	require.Positive(t, deadlocks.Load(), "batches touching the rows in opposite order deadlock")
	require.Zero(t, failed.Load(), "deliveries that failed (to a retry tier)")
	var total int
	require.NoError(t, base.Get(&total, fmt.Sprintf(`SELECT sum(balance) FROM %s.accounts`, schema)))
	require.Equal(t, deliveries, total, "every delivery's update committed once")
}
