package deduplication

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// NewWithTimelessBatches is New whose batches' MaxWait never runs out: a
// batch closes only when it is full or idle.
func NewWithTimelessBatches(cfg Config) (message.HandlerMiddleware, error) {
	return newStage(cfg, func(time.Duration) *time.Timer {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	})
}
