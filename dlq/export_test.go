package dlq

// Ack removes m from the queue, as Discard does: the scans of the external
// tests (package dlq_test) remove some of what they read.
func Ack(m *Message) error { return m.ack() }

// Internals the external tests reach.
var (
	InFamily      = inFamily
	AwaitOutcomes = awaitOutcomes
	Scan          = scanQueue
)
