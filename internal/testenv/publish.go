package testenv

import (
	"context"

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

// RunRouter runs r on ctx in a goroutine and returns once it is running;
// the channel receives what Run returned (after r.Close, or ctx's end).
func RunRouter(ctx context.Context, r *message.Router) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-r.Running()
	return done
}
