package router_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/router"
)

// batchedStages is docs/deduplication.md's group-commit line.
func batchedStages(store deduplication.Store) router.Stages {
	return router.Stages{
		Inbox: &deduplication.Config{Store: store, Batch: &deduplication.BatchConfig{}},
	}
}

func TestAddTakesAnInboxWithGroupCommit(t *testing.T) {
	t.Parallel()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	e, err := embedded.New(embedded.Config{Topic: "orders"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "n", Handler: func(*message.Message) error { return nil },
		Stages: batchedStages(deduplication.NewMemoryStore())})
	require.NoError(t, err)
	bad := batchedStages(deduplication.NewMemoryStore())
	bad.Inbox.Batch.MaxBatch = -1
	e2, err := embedded.New(embedded.Config{Topic: "payments"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e2.Close() })
	_, err = router.Add(r, router.HandlerConfig{Broker: e2, Name: "m", Handler: func(*message.Message) error { return nil }, Stages: bad})
	require.ErrorContains(t, err, "Config.Batch.MaxBatch must be between 1 and 1000")
}
