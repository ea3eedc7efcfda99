package dlq

// Ack removes m from the queue, as Discard does: the scans of the external
// tests (package dlq_test) remove some of what they read.
func Ack(m *Message) error { return m.ack() }

// Internals the external tests reach.
var (
	InFamily      = inFamily
	AwaitOutcomes = awaitOutcomes
	Scan          = scanQueue
	// NewStatsCounter is Queue.Stats' counter (StatsOf's), to watch what
	// it holds as it counts.
	NewStatsCounter = newStatsCounter
)

// CallTimeout is the bound of each wait on the broker or a store.
const CallTimeout = callTimeout

// StatsCounter is the counter NewStatsCounter returns.
type StatsCounter = statsCounter

// Stats' default top and its capacity for a top (Stats.Capacity).
const TopDefault = topDefault

var Capacity = capacity
