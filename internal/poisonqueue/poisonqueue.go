// Package poisonqueue holds what Sluice's packages agree on about a poison
// queue: its default name's suffix and the x-delivery-limit a quorum one is
// declared with (rabbitmq's Topology, dlq), the classes isolated in it by
// default (the poison stage, router's counters at zero).
package poisonqueue

import (
	"math"

	"github.com/sluicemq/sluice"
)

// Suffix makes a queue's default poison queue, "<Queue>.poison".
const Suffix = ".poison"

// DeliveryLimit is the x-delivery-limit of a quorum poison queue:
// large enough that no reading of it ever reaches it (each look at a
// message counts one delivery on RabbitMQ 3.x to 4.2), and a limit all the
// same, because a quorum queue without one — RabbitMQ 3.x's default, or
// -1 ("unlimited") on 4.x — puts a message returned by basic.nack at the
// tail of the queue (rabbit_fifo turns the return into a requeue), so that
// reading its head and putting it back would move it behind the others,
// while a queue with a limit keeps returned messages at its head, in order.
// On 4.x, a quorum queue declared with no limit would get 20, and the
// poison queue has no dead-letter target: 20 looks would drop a message.
const DeliveryLimit = math.MaxInt32

// ClassesDefault are the failure classes the poison stage isolates when
// its Config.Classes is empty, and so the classes router.Add exports
// sluice.poisoned at zero for.
var ClassesDefault = []sluice.Class{sluice.ClassPoison, sluice.ClassInvariant, sluice.ClassExhausted}
