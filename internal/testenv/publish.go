package testenv

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
)

// PublishEvents publishes n messages to topic on pub, each with a payload
// of "{}" and the event id "evt-<i>".
func PublishEvents(t testing.TB, pub message.Publisher, topic string, n int) {
	t.Helper()
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, pub.Publish(topic, m))
	}
}
