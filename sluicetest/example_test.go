package sluicetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicetest"
)

// A handler whose card service times out on its first two attempts goes
// through the first two tiers of the default ladder — 30s and 5m of
// virtual time — and is processed; a card the bank declines is rejected.
func Example() {
	t := &testing.T{} // in a test: the test's own t
	h := sluicetest.New(t, sluicetest.Config{Handler: service.Handler{
		Handler: func(msg *message.Message) error {
			if string(msg.Payload) == "declined" {
				return sluice.Reject(errors.New("card declined"))
			}
			if n, _ := sluice.Attempt(msg); n <= 2 {
				return fmt.Errorf("card service: %w", context.DeadlineExceeded)
			}
			return nil
		},
	}})
	defer func() { _ = h.Shutdown() }()

	h.Publish("slow card", sluicetest.Message("evt-1", []byte("ok")))
	h.Publish("declined", sluicetest.Message("evt-2", []byte("declined")))
	h.Settle()
	fmt.Println(h.Trace("slow card").Outcomes())
	fmt.Println(h.Trace("slow card").Last().At)
	fmt.Println(h.Trace("declined").Outcomes())
	// Output:
	// [retried to tier 1 retried to tier 2 processed]
	// 5m30s
	// [rejected]
}
