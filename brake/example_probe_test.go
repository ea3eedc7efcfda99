package brake_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
)

// With a Probe (db.PingContext in a service; router.Add takes the inbox
// store's Ping), the brake tests the database at the end of each cool-down
// without touching a message: the two refused pings take no delivery, and
// only once a ping passes does one delivery probe.
func ExampleConfig_probe() {
	var pings atomic.Int32
	b, err := brake.New(brake.Config{Window: 1, CoolDown: time.Millisecond, Pausing: true, Match: brake.MatchUnreachable,
		Probe: func(context.Context) error {
			if pings.Add(1) <= 2 {
				return fmt.Errorf("ping: %w", syscall.ECONNREFUSED)
			}
			return nil
		}})
	if err != nil {
		panic(err)
	}
	defer func() { _ = b.Close() }()
	handler := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, fmt.Errorf("begin: %w", syscall.ECONNREFUSED)
	})
	_, err = handler(message.NewMessage(watermill.NewUUID(), nil))
	fmt.Println(errors.Is(err, sluice.ErrHeld), b.State())
	for b.State() != brake.Probing {
		time.Sleep(time.Millisecond)
	}
	fmt.Println(pings.Load(), "pings,", b.State())
	// Output:
	// true engaged
	// 3 pings, probing
}
