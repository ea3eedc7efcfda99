package deduplication_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
)

// timelessBatches is the inbox with group commit on SQLite whose batches'
// MaxWait never runs out (deduplication.NewWithTimelessBatches): a batch
// closes only when full or, without Linger, idle.
func timelessBatches(t *testing.T, batch deduplication.BatchConfig) (func(key string, h message.HandlerFunc) error, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	stage, err := deduplication.NewWithTimelessBatches(deduplication.Config{Store: testenv.SQLStore(t, testenv.SQLite(t), "inbox"), Consumer: "c",
		Batch: &batch, Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}})
	require.NoError(t, err)
	return func(key string, h message.HandlerFunc) error {
		msg := message.NewMessage(key, nil)
		msg.Metadata.Set(sluice.EventIDKey, key)
		msg.SetContext(context.Background())
		_, err := stage(h)(msg)
		return err
	}, reader
}

// awaitDelivery waits for a delivery's result, bounded: a batch waiting for
// a timer that never runs out would hold it for good.
func awaitDelivery(t *testing.T, done <-chan error, why string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal(why)
		return nil
	}
}

// A batch whose deliveries are all done, none waiting for its turn, commits
// without waiting for MaxWait: a lone delivery is not held for company.
func TestABatchCommitsOnceItsDeliveriesAreDone(t *testing.T) {
	t.Parallel()
	deliver, reader := timelessBatches(t, deduplication.BatchConfig{MaxBatch: 8})
	done := make(chan error, 1)
	go func() {
		done <- deliver("lone", func(*message.Message) ([]*message.Message, error) { return nil, nil })
	}()
	require.NoError(t, awaitDelivery(t, done, "the lone delivery waited for MaxWait"))
	count, largest := testenv.Histogram(t, reader, telemetry.MetricInboxBatchSize)
	require.Equal(t, uint64(1), count)
	require.Equal(t, int64(1), largest)
	require.NoError(t, deliver("lone", func(*message.Message) ([]*message.Message, error) {
		return nil, errors.New("ran twice")
	}), "committed: a duplicate now")
}

// With Linger a batch goes on taking in deliveries after the ones it took
// in are done: one that arrives once the first returned from its handler
// shares its commit.
func TestALingeringBatchTakesInALateDelivery(t *testing.T) {
	t.Parallel()
	deliver, reader := timelessBatches(t, deduplication.BatchConfig{MaxBatch: 2, Linger: true})
	ran := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- deliver("first", func(*message.Message) ([]*message.Message, error) {
			close(ran)
			return nil, nil
		})
	}()
	<-ran
	second := make(chan error, 1)
	go func() {
		second <- deliver("second", func(*message.Message) ([]*message.Message, error) { return nil, nil })
	}()
	require.NoError(t, awaitDelivery(t, first, "the batch did not close when full"))
	require.NoError(t, awaitDelivery(t, second, "the batch did not close when full"))
	count, largest := testenv.Histogram(t, reader, telemetry.MetricInboxBatchSize)
	require.Equal(t, uint64(1), count, "one commit")
	require.Equal(t, int64(2), largest)
}
