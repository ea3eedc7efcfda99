package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
)

// OutboxMemoryWorkerEnv is the environment variable that makes a process
// of the outbox-memory suite's binary a relay process: its value is the
// relay's configuration (JSON).
const OutboxMemoryWorkerEnv = "SLUICE_BENCH_OUTBOX_MEMORY_WORKER"

// Worker runs this process as a child process of a suite when the
// environment says it is one (ScaleOutWorkerEnv, OutboxMemoryWorkerEnv):
// ran says whether it was.
func Worker() (ran bool, err error) {
	if cfg := os.Getenv(ScaleOutWorkerEnv); cfg != "" {
		return true, ScaleOutWorker(cfg)
	}
	if cfg := os.Getenv(OutboxMemoryWorkerEnv); cfg != "" {
		return true, outboxMemoryWorker(cfg)
	}
	return false, nil
}

// outboxMemoryRowBytes is the payload of one row of the outbox-memory
// suite: 1.5 MB, as in issue 28.15.
const outboxMemoryRowBytes = 1500 * 1000

// OutboxMemory measures the relay's memory against its batch's bytes: the
// same rows of 1.5 MB (min(o.Messages, 300) of them, written beforehand)
// relayed by a process of their own with BatchSize 300 and each BatchBytes
// — the default 16 MiB, 4 MiB, and no bound (1<<40: a batch of BatchSize
// rows, what the relay did before) — and prints each process's peak RSS
// (VmHWM, Linux), its largest batch and its time. Variants interleaved,
// max(o.Rounds/6, 1) rounds; medians.
func OutboxMemory(ctx context.Context, o Options) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return outboxMemory(ctx, o, self, max(o.Rounds/6, 1))
}

type outboxMemoryWorkerConfig struct {
	PostgresURL, AMQPURL, Table string
	BatchBytes                  int64
	Rows                        int
}

type outboxMemoryResult struct {
	PeakRSSKiB   int64
	LargestBatch int64
	Seconds      float64
}

func outboxMemory(ctx context.Context, o Options, self string, rounds int) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_outbox_memory", 2, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	store, _, admin, closeEnv, err := outboxEnv(ctx, o, db, schema)
	if err != nil {
		return err
	}
	defer closeEnv()
	queue := fmt.Sprintf("sluice_bench_outbox_memory_%d", time.Now().UnixNano())
	if err := admin.declare(queue); err != nil {
		return err
	}
	defer admin.delete(queue)
	rows := min(o.Messages, 300)
	variants := []struct {
		name  string
		bytes int64
	}{
		{"BatchBytes 16 MiB (the default)", 0},
		{"BatchBytes 4 MiB", 4 << 20},
		{"no byte bound (before)", 1 << 40},
	}
	results := make([][]outboxMemoryResult, len(variants))
	payload := bytes.Repeat([]byte("x"), outboxMemoryRowBytes)
	ms := make([]*message.Message, rows)
	for round := range rounds {
		for i := range variants {
			v := variants[(i+round)%len(variants)]
			for j := range ms {
				ms[j] = message.NewMessage(watermill.NewUUID(), payload)
			}
			if err := writeOutbox(ctx, db, store, queue, ms); err != nil {
				return err
			}
			cfg, err := json.Marshal(outboxMemoryWorkerConfig{PostgresURL: o.PostgresURL, AMQPURL: o.AMQPURL,
				Table: schema + ".outbox", BatchBytes: v.bytes, Rows: rows})
			if err != nil {
				return err
			}
			res, err := outboxMemoryRun(ctx, self, string(cfg))
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			results[(i+round)%len(variants)] = append(results[(i+round)%len(variants)], res)
			if err := admin.do(func(ch *amqp.Channel) error { _, err := ch.QueuePurge(queue, false); return err }); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(o.Out, "outbox-memory: the relay's peak RSS, %d rows of 1.5 MB relayed by a process of their own, BatchSize 300 (median of %d)\n", rows, rounds)
	medians := make([][3]float64, len(variants)) // peak RSS (KiB), largest batch, seconds
	for i := range variants {
		var rss, largest, secs []float64
		for _, r := range results[i] {
			rss, largest, secs = append(rss, float64(r.PeakRSSKiB)), append(largest, float64(r.LargestBatch)), append(secs, r.Seconds)
		}
		medians[i] = [3]float64{Median(rss), Median(largest), Median(secs)}
	}
	unbounded := medians[len(variants)-1][0]
	table := make([][]string, len(variants))
	for i, v := range variants {
		m := medians[i]
		table[i] = []string{v.name, fmt.Sprintf("%.0f MB", m[0]*1024/1e6), fmt.Sprintf("%.1f MB", m[1]/1e6),
			fmt.Sprintf("%.1f s", m[2]), fmt.Sprintf("%.2f", m[0]/unbounded)}
	}
	Table(o.Out, []string{"variant", "peak RSS", "largest batch", "time", "RSS ÷ no bound"}, table)
	return nil
}

// outboxMemoryRun starts a relay process (self, with cfg) and reads its
// result, the last line it prints.
func outboxMemoryRun(ctx context.Context, self, cfg string) (outboxMemoryResult, error) {
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, self)
	cmd.Env = append(os.Environ(), OutboxMemoryWorkerEnv+"="+cfg)
	stderr := &boundedBuffer{max: 4096}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return outboxMemoryResult{}, fmt.Errorf("relay process: %w: %s", err, stderr.String())
	}
	var res outboxMemoryResult
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return outboxMemoryResult{}, fmt.Errorf("relay process printed %q: %w", lines[len(lines)-1], err)
	}
	return res, nil
}

// largestBatch is an outbox store that notes its largest batch, in bytes
// of payload.
type largestBatch struct {
	*sluicesql.Outbox
	largest int64
}

func (l *largestBatch) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	b, err := l.Outbox.Due(ctx, limit, maxBytes)
	if err == nil {
		var n int64
		for _, r := range b.Rows() {
			n += int64(len(r.Message.Payload))
		}
		l.largest = max(l.largest, n) // Concurrency 1: one Due at a time
	}
	return b, err
}

// outboxMemoryWorker relays the rows of cfg's table until none is left and
// prints its result (outboxMemoryResult, JSON) on a line.
func outboxMemoryWorker(cfg string) error {
	var w outboxMemoryWorkerConfig
	if err := json.Unmarshal([]byte(cfg), &w); err != nil {
		return fmt.Errorf("%s: %w", OutboxMemoryWorkerEnv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	db, err := sqlx.Open("postgres", w.PostgresURL)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(2)
	s, err := sluicesql.NewOutbox(db, sluicesql.OutboxConfig{Table: w.Table})
	if err != nil {
		return err
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: w.AMQPURL}})
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	store := &largestBatch{Outbox: s}
	r, err := outbox.NewRelay(store, pub, outbox.RelayConfig{BatchSize: 300, BatchBytes: w.BatchBytes,
		StatsInterval: -1}) // the default PollInterval, as a user's relay
	if err != nil {
		return err
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.WithoutCancel(ctx)) }()
	var left int
	for {
		if err := db.GetContext(ctx, &left, "SELECT count(*) FROM "+w.Table); err != nil {
			return errors.Join(err, r.Close(), <-done)
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%d of %d rows left: %w", left, w.Rows, ctx.Err()), r.Close(), <-done)
		case <-time.After(20 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	if err := errors.Join(r.Close(), <-done); err != nil {
		return err
	}
	rss, err := peakRSS()
	if err != nil {
		return err
	}
	line, err := json.Marshal(outboxMemoryResult{PeakRSSKiB: rss, LargestBatch: store.largest, Seconds: elapsed.Seconds()})
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(line))
	return err
}

// peakRSS is this process's peak resident set (VmHWM), in KiB.
func peakRSS() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("peak RSS (Linux only): %w", err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}
