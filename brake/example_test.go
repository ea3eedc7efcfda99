package brake_test

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
)

// The brake engages when half of the latest deliveries could not reach the
// database. The failure that tripped it is held back (sluice.ErrHeld): the
// retry stage outside passes it through, no attempt is spent. In a stack,
// give router.Stages.Brake the Config instead: router.Add builds the brake
// and hands it to the subscriber.
func Example() {
	b, err := brake.New(brake.Config{Window: 4, Match: brake.MatchUnreachable, CoolDown: time.Minute})
	if err != nil {
		panic(err)
	}
	handler := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, fmt.Errorf("begin: %w", syscall.ECONNREFUSED)
	})
	for i := range 2 {
		_, err := handler(message.NewMessage(watermill.NewUUID(), nil))
		fmt.Println(i+1, errors.Is(err, sluice.ErrHeld), b.State())
	}
	// Output:
	// 1 false released
	// 2 true engaged
}
