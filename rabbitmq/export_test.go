package rabbitmq

import "time"

// Unexported defaults and limits the external tests (package rabbitmq_test)
// check by name.
const (
	DialTimeoutDefault   = dialTimeoutDefault
	DrainTimeoutDefault  = drainTimeoutDefault
	MappedValueMaxLength = mappedValueMaxLength
)

// MaxQueueLength is maxQueueLength.
func MaxQueueLength(delays []time.Duration, defaultPoison bool) int {
	return maxQueueLength(delays, defaultPoison)
}
