package ordering_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/ordering"
)

// A negative StoreTimeout given once to every stage (router.Stages.Env,
// service.Config.Env) means "no bound" for the inbox alone; the ordering
// stage refuses it, naming the shared field, not a Config field it does not
// have.
func TestANegativeSharedStoreTimeoutIsRefusedByName(t *testing.T) {
	t.Parallel()
	cfg := ordering.Config{Store: ordering.NewMemoryStore(), Consumer: "c", Key: sluice.KeyFromMetadata("k")}
	cfg.StoreTimeout = -1
	_, err := ordering.New(cfg)
	require.ErrorContains(t, err, "Env.StoreTimeout (the stage's own or router.Stages' and service.Config's shared Env) must not be negative")
	require.ErrorContains(t, err, "the inbox's alone")
	cfg.StoreTimeout, cfg.ResumeInterval = 0, -1
	_, err = ordering.New(cfg)
	require.ErrorContains(t, err, "Config.ResumeInterval must not be negative")
}
