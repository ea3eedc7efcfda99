package rabbitmq_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/rabbitmq"
)

// The Consumer's default drain outlasts the router's default shutdown
// grace, so the ack of a handler that commits at the end of its grace still
// reaches the broker; and it ends, with room to spare, within the 15 s
// Watermill's universal suite gives Close to cancel an unacked message's
// context (TestMessageCtx, run by TestUniversalPubSub with the defaults).
func TestTheDefaultDrainOutlastsTheDefaultGrace(t *testing.T) {
	t.Parallel()
	const watermillCloseWait = 15 * time.Second // pubsub/tests' defaultTimeout
	const defaultGrace = 10 * time.Second       // router.Stages.ShutdownGrace's default, as its doc states
	require.Greater(t, rabbitmq.DrainTimeoutDefault, defaultGrace)
	require.LessOrEqual(t, rabbitmq.DrainTimeoutDefault, watermillCloseWait-3*time.Second)
}
