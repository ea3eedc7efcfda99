package deduplication_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
)

// Issue 45: a batch's span ("sluice.batch") goes to the inbox's
// Env.TracerProvider, the one setting for it — sluice.Env says it receives
// the batch handler's spans. Before, NewBatchHandler read a TracerProvider
// of the BatchHandler's own and sent the span to the global provider when
// only the Env's was given.
func TestABatchSpanGoesToTheInboxEnvsTracerProvider(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	h, err := deduplication.NewBatchHandler(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c",
		Env: sluice.Env{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))}},
		deduplication.BatchHandler{Handle: func(context.Context, []*message.Message) []error { return nil }})
	require.NoError(t, err)
	msg := message.NewMessage("m-1", nil)
	msg.Metadata.Set(sluice.EventIDKey, "evt-1")
	_, err = h(msg)
	require.NoError(t, err)
	got := spans.GetSpans()
	require.Len(t, got, 1)
	require.Equal(t, "sluice.batch", got[0].Name)
}
