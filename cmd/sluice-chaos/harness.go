package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/localenv"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// chaosIDKey identifies a publish's event even when its payload is malformed.
const chaosIDKey = "chaos_id"

// harnessTrace keys the harness's own trace lines (settled, each process's
// stop), shown beside a left message's.
const harnessTrace = "harness"

type options struct {
	amqpURL, pgURL  string
	events, sameIDs int
	kills, procs    int
	consumers       int
	crashProb       float64
	pgDown, mqDown  time.Duration
	outboxDown      time.Duration
	outboxWrites    int
	timeout         time.Duration
	tiers           string
	subscriber      string
	seed            uint64
	scenarios       []string
	// The group commit of the …-batched scenarios.
	maxBatch, batchPrefetch int
	maxWait                 time.Duration
	// The batch handler's MaxBatch in the …-batch-handler scenarios.
	batchHandlerSize  int
	clusterScript     string
	dlxConfirmTimeout time.Duration
	ordered           orderedOptions
	// orderedNode is the ordered scenario's private node, started when the
	// harness starts (nil: the scenario starts its own).
	orderedNode *nodeStart
}

// allScenarios are the default ones. Any scenario with the suffix -batched
// runs with group commit on every inbox (deduplication.Config.Batch); with
// the suffix -batch-handler, with a batch handler
// (router.HandlerConfig.BatchHandler).
var allScenarios = []string{"kill", "rabbitmq-restart", "postgres-stop", "poison-full", "same-id-8", "outbox",
	"kill" + batchedSuffix, "postgres-stop" + batchedSuffix, "same-id-8" + batchHandlerSuffix, "kill" + batchHandlerSuffix, "postgres-stop" + batchHandlerSuffix, clusterScenario, orderedScenario}

// killCrashPoints are the consumers' self-crashes in the kill scenario.
var killCrashPoints = []string{"before-commit", "after-commit", "after-tier-publish"}

func harnessMain(args []string) error {
	var o options
	var scenarios string
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.StringVar(&o.amqpURL, "amqp-url", localenv.Get("SLUICE_TEST_AMQP_URL", localenv.AMQPURL), "RabbitMQ URL")
	fs.StringVar(&o.pgURL, "postgres-url", localenv.Get("SLUICE_TEST_POSTGRES_URL", localenv.PostgresURL), "PostgreSQL URL")
	fs.IntVar(&o.events, "events", 500, "distinct events per scenario")
	fs.IntVar(&o.sameIDs, "same-ids", 200, "ids delivered 8 times at once in same-id-8")
	fs.IntVar(&o.kills, "kills", 5, "SIGKILLs from outside in the kill scenario (the consumers also crash themselves)")
	fs.IntVar(&o.procs, "procs", 3, "consumer processes")
	fs.IntVar(&o.consumers, "consumers", 0, "subscriptions per process (0: the broker's default: 1 for sluice, 4 for watermill)")
	fs.StringVar(&o.subscriber, "subscriber", "sluice", "the consumers' subscriber: sluice (rabbitmq.Consumer) or watermill (watermill-amqp's)")
	fs.Float64Var(&o.crashProb, "crash-prob", 0.02, "probability of a self-crash at each crash point in the kill and outbox scenarios (×5 at the relay's)")
	fs.DurationVar(&o.pgDown, "postgres-down", 5*time.Second, "how long PostgreSQL is stopped")
	fs.DurationVar(&o.mqDown, "rabbitmq-down", 3*time.Second, "how long RabbitMQ is stopped")
	fs.DurationVar(&o.outboxDown, "outbox-down", 5*time.Second, "how long RabbitMQ is stopped in the outbox scenario")
	fs.IntVar(&o.outboxWrites, "outbox-writes", 500, "rows written into the outbox while RabbitMQ is stopped in the outbox scenario")
	fs.DurationVar(&o.timeout, "timeout", 4*time.Minute, "per scenario (from its setup on: "+clusterScenario+"'s cluster start is not counted)")
	fs.StringVar(&o.tiers, "tiers", "1s,2s,5s,10s,20s", "retry tiers; their sum must outlast the outages")
	fs.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "random seed (printed, for reruns)")
	fs.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "scenarios to run (any of them with the suffix -batched: with group commit; -batch-handler: with a batch handler)")
	fs.IntVar(&o.maxBatch, "max-batch", deduplication.MaxBatchDefault, "group commit's MaxBatch in the -batched scenarios")
	fs.DurationVar(&o.maxWait, "max-wait", deduplication.MaxWaitDefault, "group commit's MaxWait in the -batched scenarios")
	fs.IntVar(&o.batchHandlerSize, "batch-handler-size", 32, "the batch handler's MaxBatch in the -batch-handler scenarios (the prefetch is twice it)")
	fs.IntVar(&o.batchPrefetch, "batch-prefetch", 32, "deliveries in flight per subscription in the -batched scenarios (0: the broker's default)")
	rabbitmq4 := fs.Bool("rabbitmq4", false, "run on the RabbitMQ 4.0 node of make services (scripts/rabbitmq4.sh env: its URL, and its rabbitmqctl for the restarts and policies; cluster-node-kill's cluster runs from its directory)")
	fs.StringVar(&o.clusterScript, "cluster-script", "", "scripts/rabbitmq-cluster.sh, for "+clusterScenario+" (default: found above the working directory)")
	fs.DurationVar(&o.dlxConfirmTimeout, "dlx-confirm-timeout", 5*time.Second, clusterScenario+"'s nodes' dead_letter_worker_publisher_confirm_timeout (0: RabbitMQ's, 180 s): how soon a tier's dead-letter worker sends again the copies the main queue rejected after its leader died (docs/retry-tiers.md)")
	fs.IntVar(&o.ordered.keys, "order-keys", 40, "keys in the ordered scenario")
	fs.IntVar(&o.ordered.perKey, "order-per-key", 10, "messages per key in the ordered scenario")
	fs.IntVar(&o.ordered.poisoned, "order-poisoned", 2, "keys whose head is poisoned in the ordered scenario")
	fs.IntVar(&o.ordered.kills, "order-kills", 3, "SIGKILLs of the consumer process in the ordered scenario (one process at a time, restarted)")
	fs.Float64Var(&o.ordered.failProb, "order-fail", 0.10, "share of the ordered scenario's messages failing transiently (a third of them twice)")
	fs.Float64Var(&o.ordered.crashProb, "order-crash-prob", 0.005, "probability of a self-crash at each crash point in the ordered scenario")
	fs.BoolVar(&o.ordered.restart, "order-restart", true, "run the ordered scenario on a private RabbitMQ node and restart it midway")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rabbitmq4 {
		if err := useRabbitMQ4(&o); err != nil {
			return err
		}
	}
	o.scenarios = strings.Split(scenarios, ",")
	if o.subscriber != "sluice" && o.subscriber != "watermill" {
		return fmt.Errorf("--subscriber must be sluice or watermill, got %q", o.subscriber)
	}
	if slices.Contains(o.scenarios, orderedScenario) && o.ordered.restart {
		o.orderedNode = startNodeBeside(o.clusterScript)
		defer o.orderedNode.close()
	}
	fmt.Printf("sluice-chaos: seed %d, %d events, %d processes × %d subscriptions (%s subscriber), tiers %s\n", o.seed, o.events, o.procs, o.consumers, o.subscriber, o.tiers)
	// An interrupt ends the scenario under way through its context, so that
	// it cleans up (cluster-node-kill stops its private cluster).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	passed, failed := 0, 0
	for _, s := range o.scenarios {
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		line, err := runScenario(ctx, o, s)
		if err != nil {
			failed++
			fmt.Printf("FAIL %-18s %s: %v\n", s, line, err)
			continue
		}
		passed++
		fmt.Printf("PASS %-18s %s\n", s, line)
	}
	fmt.Printf("chaos: %d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return fmt.Errorf("%d scenarios failed", failed)
	}
	return nil
}

// publish is one message the producer sends.
type publish struct {
	id      string
	payload string
	bad     bool // malformed or invariant-violating: must end in the poison queue
}

// plan is the scenario's event set: ~10% published twice, ~5% failing
// transiently once or twice, ~1% malformed, ~0.5% violating an invariant.
type plan struct {
	publishes  []publish
	valid, bad map[string]bool
	flaky      int // events that fail transiently before they succeed
}

func makePlan(rng *rand.Rand, n, copies int) plan {
	p := plan{valid: map[string]bool{}, bad: map[string]bool{}}
	for i := range n {
		id := fmt.Sprintf("e%06d", i)
		pub := publish{id: id}
		switch r := rng.Float64(); {
		case copies > 1:
			pub.payload = fmt.Sprintf(`{"eventId":%q}`, id)
		case r < 0.01:
			pub.payload, pub.bad = fmt.Sprintf(`{"eventId":%q,"failTimes":`, id), true
		case r < 0.015:
			pub.payload, pub.bad = fmt.Sprintf(`{"eventId":%q,"invariant":true}`, id), true
		case r < 0.065:
			pub.payload = fmt.Sprintf(`{"eventId":%q,"failTimes":%d}`, id, 1+rng.IntN(2))
			p.flaky++
		default:
			pub.payload = fmt.Sprintf(`{"eventId":%q}`, id)
		}
		if pub.bad {
			p.bad[id] = true
		} else {
			p.valid[id] = true
		}
		for range copies {
			p.publishes = append(p.publishes, pub)
		}
		if copies == 1 && rng.Float64() < 0.10 {
			p.publishes = append(p.publishes, pub)
		}
	}
	if copies == 1 {
		rng.Shuffle(len(p.publishes), func(i, j int) { p.publishes[i], p.publishes[j] = p.publishes[j], p.publishes[i] })
	}
	return p
}

// world is one scenario's queue, schema and processes.
type world struct {
	o    options
	name string
	// conn reaches the broker: the shared one, or the private cluster's
	// nodes in cluster-node-kill, where quorum declares quorum queues.
	conn   rabbitmq.Connection
	quorum bool
	db     *sqlx.DB
	topo   *rabbitmq.Topology
	pub    *rabbitmq.Publisher
	procs  []*slot
	// ob is the outbox scenario's; slotArgs are added to each consumer's.
	ob *outboxWorld
	cl *clusterWorld // cluster-node-kill's
	// traces are the consumers' trace lines per event (consumer --trace,
	// in cluster-node-kill), for the diagnostics of a run that did not
	// settle.
	traces   *traceLog
	slotArgs []string
	// queueMu keeps observe's scan of the poison queue apart from the
	// poison-full fault's removal of its fillers: each holds the queue's
	// messages unacked while it reads them.
	queueMu sync.Mutex
	killed  int // SIGKILLs sent by the harness
	// restart is how rabbitmq-restart's (and outbox's) broker restart went.
	restart *testenv.Restart
	fillers int // messages that filled the poison queue in poison-full
	// at is how many effects existed when the disruption began.
	at, total int
}

func runScenario(parent context.Context, o options, scenario string) (string, error) {
	if scenario == orderedScenario || scenario == orderedControl {
		ctx, cancel := context.WithTimeout(parent, o.timeout)
		defer cancel()
		return runOrdered(ctx, o, scenario)
	}
	rng := rand.New(rand.NewPCG(o.seed, uint64(len(scenario))))
	base, batched := strings.CutSuffix(scenario, batchedSuffix)
	base, batchHandler := strings.CutSuffix(base, batchHandlerSuffix)
	w := &world{o: o, name: fmt.Sprintf("chaos_%s_%d", strings.ReplaceAll(scenario, "-", "_"), rng.Uint32()), conn: rabbitmq.Connection{URL: o.amqpURL}}
	if base == clusterScenario {
		defer w.stopCluster() // deferred first: after the teardown
		// The cluster's start is not the scenario's: it has a bound of its
		// own (the script's commands, 3 min each), and on a loaded machine
		// it took 1m14s–2m14s of the 4 min the scenario had.
		if err := w.startCluster(parent, batched); err != nil {
			return "cluster", err
		}
		w.traces = &traceLog{}
	}
	ctx, cancel := context.WithTimeout(parent, o.timeout)
	defer cancel()
	if err := w.setup(ctx); err != nil {
		return "setup", err
	}
	defer w.teardown()
	if w.cl != nil {
		if err := w.readLeaders(ctx); err != nil {
			return "setup", err
		}
	}
	if base == "outbox" {
		if err := w.setupOutbox(ctx); err != nil {
			return "setup", err
		}
	}
	if batched {
		w.batchArgs()
	}
	if batchHandler {
		w.batchHandlerArgs()
		w.traces = &traceLog{} // a message left at the end is shown with its copies' fates
	}

	copies, procs, crashProb := 1, o.procs, 0.0
	n := o.events
	if base == "kill" || base == "outbox" {
		crashProb = o.crashProb
	}
	if base == "same-id-8" {
		// 8 handlers at once: Sluice's subscriber has 16 deliveries in
		// flight per process; watermill-amqp's one per subscription.
		copies, n, procs = 8, o.sameIDs, 2
		if o.subscriber == "watermill" {
			procs = max(2, 8/cmp.Or(o.consumers, rabbitmqConsumers))
		}
	}
	p := makePlan(rng, n, copies)
	start := time.Now()
	first := p.publishes
	if w.cl != nil {
		first = w.clusterPlan(p)
	}
	if err := w.produce(ctx, first); err != nil {
		return "produce", err
	}
	for range procs {
		w.procs = append(w.procs, w.startSlot(crashProb))
	}

	var disrupt error
	done := make(chan struct{})
	w.total = len(p.valid)
	go func() {
		defer close(done)
		disrupt = w.disrupt(ctx, rng, base)
	}()
	settleErr := w.settle(ctx, p)
	if settleErr != nil && w.cl != nil {
		fmt.Print(w.diagnose(p))
	}
	w.traces.add(harnessTrace, time.Now().Format("15:04:05.000")+" settled")
	<-done
	for i, s := range w.procs {
		w.traces.add(harnessTrace, fmt.Sprintf("%s stopping process %d", time.Now().Format("15:04:05.000"), i+1))
		s.stop()
	}
	res, verifyErr := w.verify(p)
	restarts, crashes, counts := 0, map[string]int{}, map[string]int{}
	for _, s := range w.procs {
		restarts += s.restarts
		for k, v := range s.crashes {
			crashes[k] += v
		}
		for k, v := range s.counts {
			counts[k] += v
		}
	}
	disruption := describeDisruption(base, w.killed, w.fillers, crashes, restarts, w.at, w.total)
	if w.cl != nil {
		disruption = w.cl.describe(len(w.procs), restarts)
	}
	switch {
	case w.restart != nil && base == "rabbitmq-restart":
		disruption += fmt.Sprintf(" (the broker down %s, serving again %s after stop_app; %s)", w.restart.Down.Round(100*time.Millisecond), w.restart.Took.Round(100*time.Millisecond), w.restart.Boot)
	case w.restart != nil:
		disruption += fmt.Sprintf(" (%s)", w.restart.Boot)
	}
	if batched || batchHandler {
		if crashProb > 0 {
			disruption += fmt.Sprintf("; self-crashes %s %d (with %d other deliveries handled, awaiting their commit)", midBatchPoint, crashes[midBatchPoint], counts["mid-batch-awaiting"])
		}
		disruption += "; " + describeBatches(counts)
	}
	line := fmt.Sprintf("%d events (%d publishes: %d duplicate, %d transient, %d bad); %s; %s in %s",
		n, len(p.publishes), len(p.publishes)-n, p.flaky, len(p.bad), disruption, res, time.Since(start).Round(100*time.Millisecond))
	return line, errors.Join(disrupt, settleErr, verifyErr)
}

func describeDisruption(scenario string, killed, fillers int, crashes map[string]int, restarts, at, total int) string {
	switch scenario {
	case "kill":
		var parts []string
		for _, k := range killCrashPoints {
			parts = append(parts, fmt.Sprintf("%s %d", k, crashes[k]))
		}
		return fmt.Sprintf("%d SIGKILLs from %d/%d effects on + self-crashes %s; %d restarts", killed, at, total, strings.Join(parts, ", "), restarts)
	case "poison-full":
		return fmt.Sprintf("poison queue full (reject-publish, %d fillers) for 3 s from %d/%d effects on", fillers, at, total)
	case "same-id-8":
		return "each id published 8 times in a row, handled by at least 8 handlers at once"
	case "postgres-terminate":
		return fmt.Sprintf("%d consumer connections in a transaction terminated from %d/%d effects on", killed, at, total)
	case "outbox":
		return describeOutbox(killed, crashes, restarts, at, total)
	}
	return fmt.Sprintf("%s at %d/%d effects", scenario, at, total)
}

func (w *world) setup(ctx context.Context) error {
	db, err := sqlx.ConnectContext(ctx, "postgres", w.o.pgURL)
	if err != nil {
		return err
	}
	w.db = db
	for _, stmt := range []string{
		"CREATE SCHEMA " + w.name,
		// No unique constraint: a double effect shows as a second row.
		"CREATE TABLE " + w.name + ".effects (event_id TEXT NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	store, err := sqlstore.New(sqlstore.Config{DB: db, Table: w.name + ".inbox"})
	if err != nil {
		return err
	}
	if err := store.CreateTable(ctx); err != nil {
		return err
	}
	delays, err := parseDelays(w.o.tiers)
	if err != nil {
		return err
	}
	w.topo, err = rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: w.name, TierDelays: delays, Quorum: w.quorum})
	if err != nil {
		return err
	}
	if w.cl != nil {
		if err := w.placeMainQueue(ctx); err != nil {
			return err
		}
	}
	if err := w.withConn(func(c *amqp.Connection) error { return w.topo.Declare(ctx, c) }); err != nil {
		return err
	}
	w.pub, err = rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: w.conn})
	return err
}

func (w *world) teardown() {
	if w.pub != nil {
		_ = w.pub.Close()
	}
	_ = w.withConn(func(c *amqp.Connection) error {
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		for _, q := range w.queues(true) {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		return nil
	})
	if w.db != nil {
		_, _ = w.db.Exec("DROP SCHEMA IF EXISTS " + w.name + " CASCADE")
		_ = w.db.Close()
	}
}

// queues returns the main and tier queues, and with all the poison queue.
func (w *world) queues(all bool) []string {
	qs := []string{w.topo.Queue()}
	for _, t := range w.topo.Tiers() {
		qs = append(qs, t.Topic)
	}
	if all {
		qs = append(qs, w.topo.PoisonQueue())
	}
	return append(qs, w.ob.queues(all)...)
}

// withConn runs fn on a fresh connection: the broker may have restarted.
func (w *world) withConn(fn func(*amqp.Connection) error) error {
	c, err := rabbitmq.Dial(w.conn, "sluice chaos")
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	return fn(c)
}

func (w *world) produce(ctx context.Context, publishes []publish) error {
	for i := 0; i < len(publishes); i += 100 {
		var batch []*message.Message
		for _, pub := range publishes[i:min(i+100, len(publishes))] {
			m := message.NewMessage(watermill.NewUUID(), []byte(pub.payload))
			m.Metadata.Set(chaosIDKey, pub.id)
			m.SetContext(ctx)
			batch = append(batch, m)
		}
		if err := w.pub.Publish(w.topo.Queue(), batch...); err != nil {
			return err
		}
	}
	return nil
}

// slot keeps one consumer process running, restarting it when it dies.
type slot struct {
	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	restarts int
	crashes  map[string]int
	counts   map[string]int // the consumers' "count <name> <n>" lines
	done     chan struct{}
}

func (w *world) startSlot(crashProb float64) *slot {
	// Each process lists the nodes from a different one: the first
	// process starts on the first node, the second on the second, …
	urls := w.conn.URLs
	if w.conn.URL != "" {
		urls = []string{w.conn.URL}
	}
	first := len(w.procs) % len(urls)
	urls = append(urls[first:len(urls):len(urls)], urls[:first]...)
	args := []string{"consumer", "--amqp-url", strings.Join(urls, ","), fmt.Sprintf("--quorum=%t", w.quorum), "--postgres-url", w.consumerURL(), "--queue", w.topo.Queue(),
		"--schema", w.name, "--tiers", w.o.tiers, "--consumers", fmt.Sprint(w.o.consumers), "--subscriber", w.o.subscriber,
		"--crash-prob", fmt.Sprint(crashProb), "--crash-points", strings.Join(killCrashPoints, ",")}
	if w.traces != nil {
		args = append(args, "--trace")
	}
	return w.spawn(append(args, w.slotArgs...))
}

// spawn keeps one process of this program running with args, restarting it
// when it dies, until the slot's stop.
func (w *world) spawn(args []string) *slot {
	s := &slot{crashes: map[string]int{}, counts: map[string]int{}, done: make(chan struct{})}
	proc := len(w.procs) + 1 // the slot's number, for the trace lines
	go func() {
		defer close(s.done)
		for first := true; ; first = false {
			s.mu.Lock()
			if s.stopping {
				s.mu.Unlock()
				return
			}
			if !first {
				s.restarts++
			}
			cmd := exec.CommandContext(context.Background(), os.Args[0], args...) // stopped by stop(), not by a context
			stderr, _ := cmd.StderrPipe()
			if err := cmd.Start(); err != nil {
				s.mu.Unlock()
				time.Sleep(200 * time.Millisecond)
				continue
			}
			s.cmd = cmd
			s.mu.Unlock()
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if point, ok := strings.CutPrefix(sc.Text(), "crash "); ok {
					s.mu.Lock()
					s.crashes[point]++
					s.mu.Unlock()
				} else if name, n, ok := countLine(sc.Text()); ok {
					s.mu.Lock()
					s.counts[name] += n
					s.mu.Unlock()
				} else if rest, ok := strings.CutPrefix(sc.Text(), "trace "); ok {
					id, what, _ := strings.Cut(rest, " ")
					w.traces.add(id, fmt.Sprintf("process %d: %s", proc, what))
				}
			}
			_ = cmd.Wait()
		}
	}()
	return s
}

func (s *slot) kill() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return false
	}
	return s.cmd.Process.Signal(syscall.SIGKILL) == nil
}

func (s *slot) stop() {
	s.mu.Lock()
	s.stopping = true
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		s.kill()
		<-s.done
	}
}

func (w *world) disrupt(ctx context.Context, rng *rand.Rand, scenario string) error {
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	// Disrupt mid-run: once a tenth of the effects exist.
	for {
		var n int
		if err := w.db.GetContext(ctx, &n, "SELECT count(DISTINCT event_id) FROM "+w.name+".effects"); err != nil {
			return err
		}
		if n >= w.total/10 {
			w.at = n
			break
		}
		sleep(20 * time.Millisecond)
	}
	switch scenario {
	case "kill":
		for range w.o.kills {
			sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
			if w.procs[rng.IntN(len(w.procs))].kill() {
				w.killed++
			}
		}
	case "rabbitmq-restart":
		r, err := testenv.RestartApp(ctx, testenv.TryRabbitmqctl, testenv.RabbitMQRoot, w.o.mqDown)
		w.restart = &r
		if err != nil {
			return fmt.Errorf("restarting RabbitMQ: %w", err)
		}
		return nil
	case "postgres-stop":
		version, err := pgVersion()
		if err != nil {
			return err
		}
		if err := run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "stop", "-m", "fast"); err != nil {
			return err
		}
		sleep(w.o.pgDown)
		return run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start")
	case "poison-full":
		return w.fillPoisonQueue(ctx, 3*time.Second)
	case "postgres-terminate":
		return w.terminateBackends(ctx, rng)
	case "outbox":
		return w.disruptOutbox(ctx, rng)
	case clusterScenario:
		return w.disruptCluster(ctx)
	}
	return nil
}

// ctl runs rabbitmqctl args against the broker under test: the
// machine's, or with --rabbitmq4 the 4.0 node's (testenv.TryRabbitmqctl).
func ctl(args ...string) error {
	_, err := testenv.TryRabbitmqctl(context.Background(), args...)
	return err
}

// useRabbitMQ4 points the harness at the RabbitMQ 4.0 node of
// scripts/rabbitmq4.sh: its URL, its installation and node name (for
// rabbitmqctl and the private cluster).
func useRabbitMQ4(o *options) error {
	script, err := findAbove("scripts/rabbitmq4.sh")
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(context.Background(), "bash", script, "env").Output()
	if err != nil {
		return fmt.Errorf("%s env: %w", script, err)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "SLUICE_TEST_AMQP_URL":
			o.amqpURL = v
		case "SLUICE_TEST_RABBITMQ_ROOT":
			testenv.RabbitMQRoot = v
		case "SLUICE_TEST_RABBITMQ_NODE":
			testenv.RabbitMQNode = v
		}
	}
	if err := ctl("await_startup", "--timeout", "10"); err != nil {
		return fmt.Errorf("the RabbitMQ 4.0 node is not running (make services starts it): %w", err)
	}
	return nil
}

// findAbove finds rel above the working directory.
func findAbove(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found above the working directory", rel)
		}
		dir = parent
	}
}

func run(name string, args ...string) error {
	out, err := exec.CommandContext(context.Background(), name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func pgVersion() (string, error) {
	entries, err := os.ReadDir("/etc/postgresql")
	if err != nil || len(entries) == 0 {
		return "", fmt.Errorf("no PostgreSQL cluster in /etc/postgresql: %w", err)
	}
	return entries[len(entries)-1].Name(), nil
}

// fillerKey marks the harness's own filler messages in a full poison queue.
const fillerKey = "chaos_filler"

// fillPoisonQueue makes the poison queue refuse new messages for d, losing
// nothing: a reject-publish length limit well above its depth (a limit
// below the depth would drop messages), then filler messages up to the
// limit, so the broker nacks every further publish; after d, the fillers
// are taken out and the limit removed.
//
// Deleting the queue instead, as this scenario first did, loses copies:
// RabbitMQ confirms a message routed to a queue that is deleted before it
// enqueues the message, so a copy published in that instant is acked and
// dropped. An operator must never delete a poison queue in use.
func (w *world) fillPoisonQueue(ctx context.Context, d time.Duration) error {
	q := w.topo.PoisonQueue()
	policy := "chaos-full-" + w.name
	return w.withConn(func(c *amqp.Connection) error {
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return err
		}
		limit := info.Messages + 500
		if err := ctl("set_policy", "--apply-to", "queues", "--priority", "100", policy,
			"^"+regexp.QuoteMeta(q)+"$", fmt.Sprintf(`{"max-length":%d,"overflow":"reject-publish"}`, limit)); err != nil {
			return err
		}
		defer func() { _ = ctl("clear_policy", policy) }()
		if err := ch.Confirm(false); err != nil {
			return err
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
		for full := false; !full; {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{
				Headers: amqp.Table{fillerKey: "1"}, Body: []byte("filler"), DeliveryMode: amqp.Persistent,
			}); err != nil {
				return err
			}
			full = !(<-confirms).Ack // nacked: the limit is reached
			w.fillers++
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		return w.removeFillers(ctx, ch, q)
	})
}

// removeFillers takes the filler messages out of q and puts the others back.
func (w *world) removeFillers(ctx context.Context, ch *amqp.Channel, q string) error {
	w.queueMu.Lock() // observe must not count the queue while its messages are out
	defer w.queueMu.Unlock()
	var keep []uint64
	for ctx.Err() == nil {
		d, ok, err := ch.Get(q, false)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if d.Headers[fillerKey] != nil {
			if err := d.Ack(false); err != nil {
				return err
			}
			continue
		}
		keep = append(keep, d.DeliveryTag)
	}
	for _, tag := range keep {
		if err := ch.Nack(tag, false, true); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// settleStable is how long settle's condition must hold before the
// consumers are stopped. The queue depths count ready messages only: a
// delivery still in a handler (unacked), or its retry copy on its way to a
// tier, is in no count. Taken as settled at that moment, the consumers'
// stop sent the delivery back, or the copy came back from its tier to no
// consumer: a message left at the end though nothing was lost — a
// duplicate copy of an event done meanwhile that failed (its batch's
// claim held by the copy that did it). Held 1 s, such work has ended or
// shows: its copy is in a tier queue.
const settleStable = time.Second

// settle waits until every valid event has its effect, every bad one is in
// a poison queue, and the main and tier queues are empty, for settleStable.
func (w *world) settle(ctx context.Context, p plan) error {
	var last string
	var since time.Time // when the condition began to hold
	for {
		effects, poisoned, depth, err := w.observe(ctx)
		if err == nil {
			last = fmt.Sprintf("%d/%d effects, %d/%d poisoned, %d in the main and tier queues", len(effects), len(p.valid), len(poisoned), len(p.bad), depth)
			settled, more := w.settledOutbox(ctx, p)
			last += more
			switch {
			case len(effects) < len(p.valid) || len(poisoned) < len(p.bad) || depth > 0 || !settled:
				since = time.Time{}
			case since.IsZero():
				since = time.Now()
			case time.Since(since) >= settleStable:
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("did not settle: %s (last error: %w)", last, errors.Join(err, ctx.Err()))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// observe reads the effects (event id → rows), the poisoned event ids
// (→ copies) and the depth of the main and tier queues.
func (w *world) observe(ctx context.Context) (map[string]int, map[string]int, int, error) {
	effects := map[string]int{}
	rows, err := w.db.QueryContext(ctx, "SELECT event_id, count(*) FROM "+w.name+".effects GROUP BY event_id")
	if err != nil {
		return nil, nil, 0, err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			_ = rows.Close()
			return nil, nil, 0, err
		}
		effects[id] = n
	}
	_ = rows.Close()
	poisoned := map[string]int{}
	depth := 0
	w.queueMu.Lock()
	defer w.queueMu.Unlock()
	err = w.withConn(func(c *amqp.Connection) error {
		ms, err := dlq.Open(c, w.topo.PoisonQueue()).Inspect(ctx, dlq.Filter{}, 0)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if m.Msg.Metadata.Get(fillerKey) == "" {
				poisoned[m.Msg.Metadata.Get(chaosIDKey)]++
			}
		}
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		for _, q := range w.queues(false) {
			info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				return err
			}
			depth += info.Messages
		}
		return nil
	})
	return effects, poisoned, depth, err
}

// verify compares the final state with the plan, exactly.
func (w *world) verify(p plan) (string, error) {
	effects, poisoned, depth, err := w.observe(context.Background())
	if err != nil {
		return "observe", err
	}
	twice, problems := exactlyOnce(effects, p.valid, "unexpected effect ", "missing effect ")
	copies := 0
	for id, n := range poisoned {
		copies += n
		if !p.bad[id] {
			problems = append(problems, "valid event poisoned "+id)
		}
	}
	for id := range p.bad {
		if poisoned[id] == 0 {
			problems = append(problems, "bad event not in the poison queue "+id)
		}
	}
	if twice > 0 {
		problems = append(problems, fmt.Sprintf("%d events with a double effect", twice))
	}
	if depth > 0 {
		problems = append(problems, fmt.Sprintf("%d messages left in the main and tier queues: %s", depth, w.leftovers(effects)))
	}
	res := fmt.Sprintf("effects %d == %d valid, %d twice; poison %d == %d bad (%d copies); queues empty: %v",
		len(effects), len(p.valid), twice, len(poisoned), len(p.bad), copies, depth == 0)
	more, outboxProblems := w.verifyOutbox(p)
	res, problems = res+more, append(problems, outboxProblems...)
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 10 {
			problems = append(problems[:10], fmt.Sprintf("… %d more", len(problems)-10))
		}
		return res, errors.New(strings.Join(problems, "; "))
	}
	return res, nil
}

// leftovers names the messages left in the main and tier queues: the queue,
// the event, its attempt, whether it has its effect — for a scenario that
// fails with messages left.
func (w *world) leftovers(effects map[string]int) string {
	var out []string
	w.queueMu.Lock()
	defer w.queueMu.Unlock()
	err := w.withConn(func(c *amqp.Connection) error {
		for _, q := range w.queues(false) {
			ms, err := dlq.Open(c, q).Inspect(context.Background(), dlq.Filter{}, 20)
			if err != nil {
				return err
			}
			for _, m := range ms {
				id := m.Msg.Metadata.Get(chaosIDKey)
				out = append(out, fmt.Sprintf("%s in %s (attempt %q, redelivered %v, effects %d)", id, q,
					m.Msg.Metadata.Get(sluice.AttemptKey), m.Delivery.Redelivered, effects[id]))
				if lines := w.traces.of(id); len(lines) > 0 {
					out = append(out, "its consumers' traces:\n    "+strings.Join(append(lines, w.traces.of(harnessTrace)...), "\n    "))
				}
			}
		}
		return nil
	})
	if err != nil {
		out = append(out, "(reading them: "+err.Error()+")")
	}
	return strings.Join(out, ", ")
}
