package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// ScaleOutWorkerEnv is the environment variable that makes a process of
// cmd/sluice-bench (or of this package's test binary) a consumer process of
// the scaleout suite instead (ScaleOutWorker): its value is the worker's
// configuration, in JSON.
const ScaleOutWorkerEnv = "SLUICE_BENCH_SCALEOUT_WORKER"

// scaleWorker is a consumer process's configuration.
type scaleWorker struct {
	PostgresURL, AMQPURL string
	Queue, Schema        string
	// Noop: a handler that does nothing, no stages.
	Noop bool
	// Conns is the process's PostgreSQL pool.
	Conns int
}

// scaleProcessConns is each consumer process's PostgreSQL pool: one
// connection per delivery in flight (one subscription, the default
// prefetch).
const scaleProcessConns = rabbitmqPrefetch

// ScaleOut prints how the full stack scales out over consumer processes:
// 1, 2 and 4 processes of one subscription each (the default prefetch, a
// pool of 16 PostgreSQL connections each) on one queue and one PostgreSQL,
// one business INSERT per delivery in the inbox's transaction, over a queue
// preloaded with o.Messages*8 messages; next to the same processes with a
// no-op handler (the broker's ceiling) and the inbox transaction by hand in
// a loop, no broker, with as many transactions side by side as the
// processes keep in flight (PostgreSQL's ceiling). Variants interleaved,
// round after round. self is the command that starts a consumer process
// (ScaleOutWorkerEnv set in its environment makes it one).
func ScaleOut(ctx context.Context, o Options) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return scaleOut(ctx, o, self, []int{1, 2, 4}, max(o.Rounds/4, 3), scaleProcessConns)
}

// scaleOut is ScaleOut with procs processes of conns PostgreSQL connections
// each, for rounds rounds.
func scaleOut(ctx context.Context, o Options, self string, procs []int, rounds, conns int) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_scale", 4, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	v, err := newInboxVariants(ctx, db, schema)
	if err != nil {
		return err
	}
	conn, pub, closeConn, err := dialBroker(o)
	if err != nil {
		return err
	}
	defer closeConn()

	n := o.Messages * 8
	// Run c is procs[c/3] processes of variant c%3.
	const noop, stack, ceiling = 0, 1, 2
	results, err := rotate(ctx, rounds, len(procs)*3, v.truncate, func(round, c int) (float64, error) {
		p, variant := procs[c/3], c%3
		run := fmt.Sprintf("scale-r%d-p%d-v%d-", round, p, variant)
		if variant == ceiling {
			return scaleCeiling(ctx, o, v, p*conns, n, run)
		}
		return scaleRun(ctx, self, conn, pub, scaleWorker{PostgresURL: o.PostgresURL, AMQPURL: o.AMQPURL, Schema: schema, Noop: variant == noop, Conns: conns}, p, n, run)
	})
	if err != nil {
		return err
	}
	rates := func(i, variant int) []float64 { return results[i*3+variant] }
	var rows [][]string
	for i, p := range procs {
		rows = append(rows, []string{strconv.Itoa(p), strconv.Itoa(p * rabbitmqPrefetch),
			f0(Median(rates(i, noop))), f0(Median(rates(i, stack))), f0(Median(rates(i, ceiling))),
			f2(MedianRatio(rates(i, stack), rates(0, stack))), f2(MedianRatio(rates(i, stack), rates(i, ceiling))), f2(MedianRatio(rates(i, stack), rates(i, noop)))})
	}
	fmt.Fprintf(o.Out, "scale-out: consumer processes of one subscription each (prefetch %d, %d PostgreSQL connections each) on one queue and one PostgreSQL, the full stack with the inbox, %d messages preloaded per run, %d rounds interleaved\n\n",
		rabbitmqPrefetch, conns, n, rounds)
	Table(o.Out, []string{"processes", "in flight", "no-op msg/s", "full stack msg/s", "PG ceiling msg/s", "full stack ÷ 1 process", "÷ PG ceiling", "÷ no-op"}, rows)
	fmt.Fprintln(o.Out, "PG ceiling: the inbox transaction by hand in a loop, no broker, as many transactions side by side as the processes keep in flight")
	return nil
}

// scaleCeiling is the inbox transaction by hand on conc connections side
// by side.
func scaleCeiling(ctx context.Context, o Options, v *inboxVariants, conc, n int, run string) (float64, error) {
	db, err := openPG(ctx, o.PostgresURL, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(conc)
	db.SetMaxIdleConns(conc)
	w := *v
	w.db = db
	return Throughput(ctx, conc, n, w.byHand(run))
}

// scaleRun preloads n messages into a fresh queue, starts procs consumer
// processes, lets them consume together once every one is ready, and
// returns n ÷ the time until they had handled all.
func scaleRun(ctx context.Context, self string, conn *amqp.Connection, pub *rabbitmq.Publisher, w scaleWorker, procs, n int, run string) (float64, error) {
	w.Queue = fmt.Sprintf("sluice_bench_scale_%d", time.Now().UnixNano())
	rabbit, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: w.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: w.Queue}})
	if err != nil {
		return 0, err
	}
	defer deleteTopology(conn, rabbit.Topology())
	defer func() { _ = rabbit.Close() }()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msgs[i].Metadata.Set(sluice.EventIDKey, run+strconv.Itoa(i))
	}
	for i := 0; i < n; i += 500 {
		if err := pub.Publish(w.Queue, msgs[i:min(i+500, n)]...); err != nil {
			return 0, err
		}
	}
	cfg, err := json.Marshal(w)
	if err != nil {
		return 0, err
	}

	counts := make([]atomic.Int64, procs)
	ready := make(chan int, procs)
	moved := make(chan struct{}, 1)
	exited := make(chan error, procs)
	stdins := make([]io.WriteCloser, procs)
	cmds := make([]*exec.Cmd, procs)
	defer func() { // stop them: the end of stdin, then a bounded wait
		for i, cmd := range cmds {
			if cmd == nil {
				continue
			}
			_ = stdins[i].Close()
			waited := make(chan struct{})
			go func() {
				_ = cmd.Wait()
				close(waited)
			}()
			select {
			case <-waited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-waited
			}
		}
	}()
	for i := range procs {
		cmd := exec.CommandContext(context.WithoutCancel(ctx), self) // stopped by the end of its stdin
		cmd.Env = append(os.Environ(), ScaleOutWorkerEnv+"="+string(cfg))
		stderr := &boundedBuffer{max: 4096}
		cmd.Stderr = stderr
		if stdins[i], err = cmd.StdinPipe(); err != nil {
			return 0, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, fmt.Errorf("starting a consumer process: %w", err)
		}
		cmds[i] = cmd
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if sc.Text() == "ready" {
					ready <- i
					continue
				}
				if c, err := strconv.ParseInt(sc.Text(), 10, 64); err == nil {
					counts[i].Store(c)
					select {
					case moved <- struct{}{}:
					default:
					}
				}
			}
			exited <- fmt.Errorf("consumer process %d ended: %s", i, stderr.String())
		}()
	}
	deadline := time.NewTimer(5 * time.Minute)
	defer deadline.Stop()
	for range procs {
		select {
		case <-ready:
		case err := <-exited:
			return 0, err
		case <-deadline.C:
			return 0, errors.New("the consumer processes were not ready in 5 minutes")
		}
	}
	start := time.Now()
	for _, in := range stdins {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			return 0, err
		}
	}
	for {
		select {
		case <-moved:
			var sum int64
			for i := range counts {
				sum += counts[i].Load()
			}
			if sum >= int64(n) {
				return float64(n) / time.Since(start).Seconds(), nil
			}
		case err := <-exited:
			return 0, err
		case <-deadline.C:
			return 0, fmt.Errorf("%d messages not handled in 5 minutes", n)
		}
	}
}

// boundedBuffer keeps the first max bytes written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p[:min(len(p), max(b.max-len(b.b), 0))]...)
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}

// ScaleOutWorker runs a consumer process of the scaleout suite, configured
// by cfg (ScaleOutWorkerEnv's value): it connects, prints "ready", starts
// consuming when it reads a line from stdin, prints how many deliveries it
// handled (a line, each time the count moved, at most every 10 ms), and
// stops at the end of stdin.
func ScaleOutWorker(cfg string) error {
	var w scaleWorker
	if err := json.Unmarshal([]byte(cfg), &w); err != nil {
		return fmt.Errorf("%s: %w", ScaleOutWorkerEnv, err)
	}
	ctx := context.Background()
	rabbit, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: w.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: w.Queue}})
	if err != nil {
		return err
	}
	defer func() { _ = rabbit.Close() }()
	var handled atomic.Int64
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	// Outside every stage: a delivery counts once the stack returned nil,
	// after its commit.
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				handled.Add(1)
			}
			return out, err
		}
	})
	if w.Noop {
		r.AddConsumerHandler("bench", w.Queue, rabbit.Endpoints().Subscriber, func(*message.Message) error { return nil })
	} else {
		db, err := openPG(ctx, w.PostgresURL, nil)
		if err != nil {
			return err
		}
		defer func() { _ = db.Close() }()
		db.SetMaxOpenConns(w.Conns)
		db.SetMaxIdleConns(w.Conns)
		store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: w.Schema + ".inbox"})
		if err != nil {
			return err
		}
		insert := "INSERT INTO " + w.Schema + ".reservations (event_key, note) VALUES ($1, 'reserved')"
		if _, err := router.Add(r, router.HandlerConfig{
			Name: "bench", Broker: rabbit,
			Handler: func(msg *message.Message) error {
				_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), insert, msg.Metadata.Get(sluice.EventIDKey))
				return err
			},
			Stages: router.Stages{
				Trace:     &stage.TraceConfig{},
				Poison:    &poison.Config{},
				Retry:     &retrytiers.Config{},
				Classify:  &stage.ClassifyConfig{},
				Inbox:     &deduplication.Config{Store: store, Consumer: "inventory"},
				Recoverer: &stage.RecovererConfig{},
			},
		}); err != nil {
			return err
		}
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if _, err := in.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx) }()
	stdinDone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, in)
		close(stdinDone)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var last int64
	for {
		select {
		case <-tick.C:
			if h := handled.Load(); h != last {
				last = h
				fmt.Println(h)
			}
		case err := <-runDone:
			return fmt.Errorf("the router stopped: %w", err)
		case <-stdinDone:
			return errors.Join(r.Close(), <-runDone)
		}
	}
}
