package sluicesql

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Pruner defaults.
const (
	prunerRetentionDefault = 7 * 24 * time.Hour
	prunerIntervalDefault  = 10 * time.Minute
	prunerBatchSizeDefault = 1000
	prunerPauseDefault     = 50 * time.Millisecond
)

// PrunerConfig configures a Pruner.
type PrunerConfig struct {
	// Store is the store to prune — an *Inbox, an *Outcomes, a
	// deduplication.MemoryStore, or any store with the method: DeleteBefore
	// deletes at most limit records processed before t and returns how many
	// it deleted. Required.
	Store interface {
		DeleteBefore(ctx context.Context, t time.Time, limit int) (int64, error)
	}
	// Retention is how long a processed key is kept. A redelivery after its
	// key is pruned runs the handler again, so it must cover the retry
	// ladder plus the replay window. Default 7 days.
	Retention time.Duration
	// RetryDelays are the delays of the retry tiers: a duplicate copy parked
	// in the tiers comes back after at most their sum.
	RetryDelays []time.Duration
	// ReplayWindow is how long after processing a message may still be
	// replayed from the poison queue or republished by an operator.
	ReplayWindow time.Duration
	// Interval is the time between two pruning runs. Default 10 min.
	Interval time.Duration
	// Env is the shared environment (service gives its own). The pruner reads
	// Logger, which reports failed runs (default watermill.NopLogger), and
	// MeterProvider, which receives the pruned counter (default the global
	// provider).
	sluice.Env

	// batchSize bounds the records one DELETE removes (1,000), so that a
	// run never holds long locks, and pause is the time between two
	// batches (50 ms); the tests set them (pruner_export_test.go).
	batchSize int
	pause     time.Duration
}

// Pruner deletes inbox records older than a retention, in batches of at
// most 1,000 records 50 ms apart (so that a run never holds long locks), on
// an interval, from Start until Close.
type Pruner struct {
	cfg    PrunerConfig
	pruned metric.Int64Counter

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// withDefaults returns a copy of c with its defaults filled.
func (c PrunerConfig) withDefaults() PrunerConfig {
	c.Retention = cmp.Or(c.Retention, prunerRetentionDefault)
	c.Interval = cmp.Or(c.Interval, prunerIntervalDefault)
	c.pause = cmp.Or(c.pause, prunerPauseDefault)
	c.batchSize = cmp.Or(c.batchSize, prunerBatchSizeDefault)
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	return c
}

// validate checks a PrunerConfig with its defaults filled.
func (c PrunerConfig) validate() error {
	var ladder time.Duration
	for i, d := range c.RetryDelays {
		if d <= 0 {
			return fmt.Errorf("sluicesql: PrunerConfig.RetryDelays[%d] must be positive, got %s", i, d)
		}
		ladder += d
	}
	switch {
	case c.Store == nil:
		return errors.New("sluicesql: PrunerConfig.Store is required")
	case c.Retention < 0, c.Interval < 0, c.pause < 0, c.ReplayWindow < 0, c.batchSize < 0:
		return errors.New("sluicesql: PrunerConfig durations and the batch size must not be negative")
	case c.Retention < ladder+c.ReplayWindow:
		return fmt.Errorf("sluicesql: PrunerConfig.Retention (%s) must cover the retry ladder (RetryDelays, %s) plus PrunerConfig.ReplayWindow (%s): a copy redelivered after its key is pruned would be processed twice",
			c.Retention, ladder, c.ReplayWindow)
	}
	return nil
}

// NewPruner validates cfg and returns a Pruner that is not yet running.
func NewPruner(cfg PrunerConfig) (*Pruner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pruned, err := telemetry.Meter(cfg.MeterProvider).Int64Counter(telemetry.MetricInboxPruned,
		metric.WithDescription("Inbox records deleted after their retention."))
	if err != nil {
		return nil, fmt.Errorf("sluicesql: creating %s counter: %w", telemetry.MetricInboxPruned, err)
	}
	return &Pruner{cfg: cfg, pruned: pruned}, nil
}

// Prune deletes the records older than the retention now, batch by batch,
// until a batch comes back short or ctx ends, and returns how many it deleted.
func (p *Pruner) Prune(ctx context.Context) (int64, error) {
	cutoff := time.Now().Add(-p.cfg.Retention)
	var total int64
	for {
		n, err := p.cfg.Store.DeleteBefore(ctx, cutoff, p.cfg.batchSize)
		total += n
		p.pruned.Add(ctx, n)
		if err != nil || n < int64(p.cfg.batchSize) {
			return total, err
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(p.cfg.pause):
		}
	}
}

// Start runs Prune now and then every Interval in a goroutine, until ctx
// ends or Close is called. It fails if the Pruner is already running.
func (p *Pruner) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		return errors.New("sluicesql: Pruner already started")
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.done = make(chan struct{})
	go p.run(ctx, p.done)
	return nil
}

func (p *Pruner) run(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		if n, err := p.Prune(ctx); err != nil && ctx.Err() == nil {
			p.cfg.Logger.Error("Pruning the "+records(p.cfg.Store)+" failed", err, watermill.LogFields{"deleted": n})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops the pruning goroutine and waits for it. It is idempotent and
// safe to call on a Pruner that was never started.
func (p *Pruner) Close() error {
	p.mu.Lock()
	cancel, done := p.cancel, p.done
	p.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	return nil
}

// records names what store holds, in the log line of a failed run.
func records(store any) string {
	if _, ok := store.(*Outcomes); ok {
		return "replay outcomes"
	}
	return "inbox"
}
