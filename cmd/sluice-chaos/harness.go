package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
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
	// injectDrop: cluster-node-kill takes one bad event's only poison copy
	// out of the poison queue after its kills, as a broker that lost it
	// would (dropped.go's check of itself).
	injectDrop bool
	ordered    orderedOptions
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
	fs.IntVar(&o.maxBatch, "max-batch", 8, "group commit's MaxBatch in the -batched scenarios (8: deduplication.BatchConfig's default)")
	fs.DurationVar(&o.maxWait, "max-wait", 2*time.Millisecond, "group commit's MaxWait in the -batched scenarios (2ms: deduplication.BatchConfig's default)")
	fs.IntVar(&o.batchHandlerSize, "batch-handler-size", 32, "the batch handler's MaxBatch in the -batch-handler scenarios (the prefetch is twice it)")
	fs.IntVar(&o.batchPrefetch, "batch-prefetch", 32, "deliveries in flight per subscription in the -batched scenarios (0: the broker's default)")
	rabbitmq4 := fs.Bool("rabbitmq4", false, "run on the RabbitMQ 4.0 node of make services (scripts/rabbitmq4.sh env: its URL, and its rabbitmqctl for the restarts and policies; cluster-node-kill's cluster runs from its directory)")
	fs.StringVar(&o.clusterScript, "cluster-script", "", "scripts/rabbitmq-cluster.sh, for "+clusterScenario+" (default: found above the working directory)")
	fs.BoolVar(&o.injectDrop, "inject-broker-drop", false, clusterScenario+": after the kills, take one bad event's only poison copy out of the poison queue, as a broker that lost it would: the run must pass and report it as the broker's loss (BROKER LOSS), not Sluice's")
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
	// start is when the run began publishing (the traces' day: lossRule).
	start time.Time
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
	// traces are the consumers' trace lines per event (consumer --trace),
	// for the diagnostics of a run that did not settle.
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

// quorumRestartGrace is what a scenario that restarts the broker on quorum
// queues gets beyond -timeout: a quorum tier's dead-letter worker whose
// copy the restarted broker refused sends it again only after
// dead_letter_worker_publisher_confirm_timeout (docs/retry-tiers.md,
// "copies late, not lost"). The suite's brokers have 10 s (make services;
// cluster-node-kill's private nodes -dlx-confirm-timeout); the grace is
// for a broker with RabbitMQ's default, 180 s, where rabbitmq-restart once
// settled in 3m9.6s on RabbitMQ 3.10.
const quorumRestartGrace = 3 * time.Minute

func runScenario(parent context.Context, o options, scenario string) (string, error) {
	if scenario == orderedScenario || scenario == orderedControl {
		if o.ordered.restart && scenario == orderedScenario { // on quorum queues, see quorumRestartGrace
			o.timeout += quorumRestartGrace
		}
		ctx, cancel := context.WithTimeout(parent, o.timeout)
		defer cancel()
		return runOrdered(ctx, o, scenario)
	}
	rng := rand.New(rand.NewPCG(o.seed, uint64(len(scenario))))
	base, batched := strings.CutSuffix(scenario, batchedSuffix)
	base, batchHandler := strings.CutSuffix(base, batchHandlerSuffix)
	// Every scenario keeps its consumers' trace lines: an event missing its
	// effect, or left in a queue, is shown with its deliveries' fates.
	w := &world{o: o, name: worldName(scenario, rng), conn: rabbitmq.Connection{URL: o.amqpURL},
		traces: &traceLog{}}
	if base == "rabbitmq-restart" || base == "outbox" {
		// The scenarios that stop the broker run on quorum queues, the
		// configuration Sluice tells users to keep for that (docs/retry-tiers.md,
		// "Durability"): a classic tier dead-letters at most once, and a copy
		// confirmed into it as the broker stops can be lost — on RabbitMQ 4.0,
		// rabbitmq-restart on classic queues lost events in 2 of 43 runs (3
		// in all); those traced were copies confirmed into the 1 s tier as
		// stop_app began (rabbitmq.TestQuorumTiersKeepEveryConfirmedCopyAcrossABrokerStop).
		// ordered does too when it restarts its node; the other scenarios keep
		// classic queues.
		w.quorum = true
	}
	if base == clusterScenario {
		defer w.stopCluster() // deferred first: after the teardown
		// The cluster's start is not the scenario's: it has a bound of its
		// own (the script's commands, 3 min each), and on a loaded machine
		// it took 1m14s–2m14s of the 4 min the scenario had.
		if err := w.startCluster(parent, batched); err != nil {
			return "cluster", err
		}
	}
	timeout := o.timeout
	if w.quorum && w.cl == nil {
		timeout += quorumRestartGrace
	}
	ctx, cancel := context.WithTimeout(parent, timeout)
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
	w.start = start
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
	settleErr := w.settle(ctx, p, done)
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
	if verifyErr != nil && settleErr == nil && w.cl != nil {
		// It settled, then did not verify: what the broker says now, and
		// whether what is missing comes back.
		fmt.Print(strings.Replace(w.diagnose(p), "did not settle", "settled, then did not verify", 1))
		fmt.Print(w.recheck(p))
	}
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
