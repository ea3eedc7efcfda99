package signing_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/signing"
)

// A Signer shared by the stages (router.Stages.Env.Signer) and `sluice dlq
// replay --signing-key-file`: a copy it signed for a queue is believed on
// that queue; the same copy on another queue, or the same headers written by
// a producer, are not.
func ExampleSigner() {
	signer, err := signing.New([]byte("a key of at least 32 random bytes!"))
	if err != nil {
		panic(err)
	}
	isAttempt := func(k string) bool { return k == sluice.AttemptKey }

	tierCopy := message.NewMessage("copy", []byte(`{"orderId":"o-1"}`))
	tierCopy.Metadata.Set(sluice.AttemptKey, "2")
	signer.Sign(tierCopy, "orders") // the queue the copy comes back to
	fmt.Println("removed from Sluice's copy:", signer.Believe(tierCopy, isAttempt, "orders"))

	forwarded := tierCopy.Copy() // a handler of "orders" sends it on to "payments"
	fmt.Println("removed on another queue:", signer.Believe(forwarded, isAttempt, "payments"))

	forged := message.NewMessage("forged", []byte(`{"orderId":"o-1"}`))
	forged.Metadata.Set(sluice.AttemptKey, "999999999999")
	fmt.Println("removed from a producer's message:", signer.Believe(forged, isAttempt, "orders"))
	// Output:
	// removed from Sluice's copy: []
	// removed on another queue: [sluice_attempt]
	// removed from a producer's message: [sluice_attempt]
}
