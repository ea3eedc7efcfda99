package deduplication_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
)

// Issue 28.13: sluice.inbox.batch.size records the deliveries a group
// commit committed: a COMMIT that failed (a deferred constraint, here)
// committed none and is not recorded. Before, it was.
func TestAFailedGroupCommitIsNotRecordedAsABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Exec(fmt.Sprintf(`ALTER TABLE %s.reservations ADD CONSTRAINT one_note UNIQUE (note) DEFERRABLE INITIALLY DEFERRED`, b.schema))
	require.NoError(t, err)
	d, err := deduplication.New(deduplication.Config{Store: b.store, Consumer: "inventory", Env: sluice.Env{MeterProvider: b.meter}, Batch: &deduplication.BatchConfig{MaxBatch: 4}})
	require.NoError(t, err)
	h := d(b.reserve(nil))
	_, err = h(event("evt-1"))
	require.NoError(t, err, "one reservation commits")
	count, _ := testenv.Histogram(t, b.reader, telemetry.MetricInboxBatchSize)
	require.Equal(t, uint64(1), count)
	_, err = h(event("evt-2")) // a second 'reserved' note: the COMMIT fails
	require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err), "%v", err)
	count, _ = testenv.Histogram(t, b.reader, telemetry.MetricInboxBatchSize)
	require.Equal(t, uint64(1), count, "the failed COMMIT is not a batch")
}
