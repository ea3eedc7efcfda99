package dlq

// Internals the external tests (package dlq_test) reach.
var (
	InFamily      = inFamily
	AwaitOutcomes = awaitOutcomes
)
