package main

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// newRun returns a new run id: kind, the time, and a random tail
// ("run-20260105T120000Z-3f2a9c1b"), as the console names its runs: any
// unique string is a run id to the library (dlq.ReplayConfig.Run), and the
// CLI, a module of its own on the library's public API, makes its own.
func newRun(kind string) string {
	return kind + "-" + time.Now().UTC().Format("20060102T150405Z") + "-" + watermill.NewShortUUID()[:8]
}
