package sluicesql

import "time"

// PrunerBatches returns cfg with the pruner's batch size and pause between
// batches (1,000 rows and 50 ms unless set), which the tests shorten.
func PrunerBatches(cfg PrunerConfig, size int, pause time.Duration) PrunerConfig {
	cfg.batchSize, cfg.pause = size, pause
	return cfg
}
