package inherit_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/signing"
)

// inherit.Env gives each zero field the parent's and keeps each set one: a
// stage's own settings win over router.Stages' and service.Config's, field
// by field, and a Signer holding a nil *signing.Signer (no key) is zero, as
// the nil pointer was before the fields moved into Env.
func TestEnvKeepsOwnFieldsAndFillsTheZeroOnes(t *testing.T) {
	t.Parallel()
	key, err := signing.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	other, err := signing.New([]byte("fedcba9876543210fedcba9876543210"))
	require.NoError(t, err)
	parent := sluice.Env{Logger: watermill.NopLogger{}, MeterProvider: metricnoop.NewMeterProvider(),
		TracerProvider: tracenoop.NewTracerProvider(), Clock: sluice.SystemClock(), Classifier: sluice.DefaultClassifier(), Signer: key}

	require.Equal(t, parent, inherit.Env(sluice.Env{}, parent), "a zero Env takes every field")
	require.Equal(t, parent, inherit.Env(sluice.Env{Signer: (*signing.Signer)(nil)}, parent), "a nil *signing.Signer is no key: the parent's is taken")

	classifier, err := sluice.NewClassifier(sluice.ClassifierConfig{})
	require.NoError(t, err)
	own := sluice.Env{Classifier: classifier, Signer: other}
	got := inherit.Env(own, parent)
	require.Same(t, own.Classifier, got.Classifier)
	require.Same(t, other, got.Signer)
	require.Equal(t, parent.Logger, got.Logger)
	require.Equal(t, parent.MeterProvider, got.MeterProvider)

	require.Equal(t, sluice.Env{}, inherit.Env(sluice.Env{}, sluice.Env{}), "nothing given: each stage's defaults")

	bounds := sluice.Env{PublishTimeout: time.Minute, PublishBackoff: time.Second, StoreTimeout: 3 * time.Second}
	require.Equal(t, bounds, inherit.Env(sluice.Env{}, bounds), "the bounds are inherited too")
	got = inherit.Env(sluice.Env{StoreTimeout: -1, PublishBackoff: time.Millisecond}, bounds)
	require.Equal(t, sluice.Env{PublishTimeout: time.Minute, PublishBackoff: time.Millisecond, StoreTimeout: -1}, got,
		"a stage's own bound wins, a negative one (no bound) too")
}
