package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
)

// The ordered scenario (order per key through retries, ordering.Config)
// and its control, the same run without Stages.Order, which passes only
// when the check finds keys out of order.
const (
	orderedScenario = "ordered"
	orderedControl  = "ordered-control"
)

// orderedOptions are the ordered scenario's flags.
type orderedOptions struct {
	keys, perKey, poisoned, kills int
	failProb, crashProb           float64
	restart                       bool
}

// orderedWorld is what the ordered scenario saw.
type orderedWorld struct {
	plan    orderPlan
	store   ordering.Store
	control bool
	node    *privateCluster // the private RabbitMQ node it restarts
	// Measured.
	killsAt []int // effects at each SIGKILL
	restart int   // effects when the broker stopped; -1 if it did not
	// down is from stop_app's return to start_app's first run; restartTook
	// from stop_app's run until the node served again (rabbitmqctl boots a
	// VM each); boot is how start_app went.
	down, restartTook time.Duration
	boot              testenv.Boot
	settled           time.Duration // from the first publish to every reachable effect
	released          time.Duration // from the skips to the poisoned keys' last effect
	maxHeld           int           // the most messages held at once (sampled)
}

// runOrdered runs the ordered scenario (or its control) on a private
// RabbitMQ node of its own, which it restarts mid-run; the shared broker
// is never touched.
func runOrdered(parent context.Context, o options, scenario string) (string, error) {
	ctx, cancel := context.WithTimeout(parent, o.timeout)
	defer cancel()
	rng := rand.New(rand.NewPCG(o.seed, uint64(len(scenario))))
	oo := o.ordered
	if scenario == orderedControl { // retries alone reorder: no kills, no restart needed
		oo.kills, oo.restart, oo.crashProb = 0, false, 0
		o.ordered = oo
	}
	ow := &orderedWorld{control: scenario == orderedControl, restart: -1,
		plan: makeOrderPlan(rng, oo.keys, oo.perKey, oo.poisoned, oo.failProb)}
	w := &world{o: o, name: worldName(scenario, rng), conn: rabbitmq.Connection{URL: o.amqpURL}}
	if oo.restart {
		ns := o.orderedNode
		if ns == nil {
			ns = startNodeBeside(o.clusterScript)
			defer ns.close()
		}
		node, took, err := ns.wait(ctx)
		if err != nil {
			return "private node", err
		}
		fmt.Printf("  %s: private RabbitMQ node started in %s\n", scenario, took.Round(100*time.Millisecond))
		ow.node, w.conn = node, rabbitmq.Connection{URL: node.URLs[0]}
		w.quorum = true // it stops the broker: quorum queues, as rabbitmq-restart (harness.go)
	}
	if err := w.setup(ctx); err != nil {
		return "setup", err
	}
	defer w.teardown()
	if _, err := w.db.ExecContext(ctx, "ALTER TABLE "+w.name+".effects ADD COLUMN n bigserial PRIMARY KEY, ADD COLUMN order_key text, ADD COLUMN seq int"); err != nil {
		return "setup", err
	}
	var err error
	stores, err := sluicesql.New(w.db, sluicesql.Config{Schema: w.name, Order: sluicesql.OrdersConfig{TablePrefix: "order"}})
	if err != nil {
		return "setup", err
	}
	ow.store = stores.Order
	if err := stores.Migrate(ctx); err != nil {
		return "setup", err
	}

	start := time.Now()
	if err := w.produceOrdered(ctx, ow.plan.publishes); err != nil {
		return "produce", err
	}
	args := []string{"ordered-consumer", "--amqp-url", w.conn.URL, "--postgres-url", w.consumerURL(), "--queue", w.topo.Config().Queue,
		"--schema", w.name, "--tiers", o.tiers, "--crash-prob", fmt.Sprint(oo.crashProb), fmt.Sprintf("--unordered=%t", ow.control),
		fmt.Sprintf("--quorum=%t", w.quorum)}
	// One consumer process at a time: the queue has one consumer, as a
	// partition with single active consumer has; each SIGKILL starts the
	// next.
	w.procs = append(w.procs, w.spawn(args))
	defer func() {
		for _, s := range w.procs {
			s.stop()
		}
	}()
	errc := make(chan error, 1)
	go func() { errc <- w.disruptOrdered(ctx, ow, rng) }()
	settleErr := w.settleOrdered(ctx, ow, false)
	ow.settled = time.Since(start)
	disruptErr := <-errc
	if err := errors.Join(settleErr, disruptErr); err != nil {
		return ow.describe(w), err
	}
	before, problems, err := w.checkOrdered(ctx, ow, false)
	if err != nil {
		return ow.describe(w), err
	}
	if ow.control {
		if len(before) == 0 {
			return ow.describe(w), errors.New("the control run without Stages.Order applied every key in order: the check cannot tell")
		}
		return fmt.Sprintf("%s; without Stages.Order the check finds %d of %d keys violated (%s), as it must", ow.describe(w), len(before), len(ow.plan.keys), summarize(before)), nil
	}
	if len(before) > 0 || len(problems) > 0 {
		return ow.describe(w), violationsError(before, problems)
	}
	// The operator skips each poisoned head: its key releases the rest.
	skipAt := time.Now()
	for key := range ow.plan.poisonAt {
		if _, ok, err := ordering.Skip(ctx, ow.store, orderedHandlerName, key); err != nil || !ok {
			return ow.describe(w), fmt.Errorf("skipping the head of %s: skipped %t: %w", key, ok, err)
		}
	}
	if err := w.settleOrdered(ctx, ow, true); err != nil {
		return ow.describe(w), err
	}
	ow.released = time.Since(skipAt)
	after, problems, err := w.checkOrdered(ctx, ow, true)
	if err != nil {
		return ow.describe(w), err
	}
	line := ow.describe(w) + fmt.Sprintf("; every key in publish order, each once; %d poisoned keys held their rest, released in order %s after ordering.Skip",
		len(ow.plan.poisonAt), ow.released.Round(100*time.Millisecond))
	if len(after) > 0 || len(problems) > 0 {
		return line, violationsError(after, problems)
	}
	return line, nil
}

// nodeStart is a private RabbitMQ node starting in the background: the
// harness starts the ordered scenario's when it starts, so that its boot
// overlaps the scenarios before it.
type nodeStart struct {
	done chan struct{}
	node *privateCluster
	took time.Duration
	err  error
}

func startNodeBeside(script string) *nodeStart {
	ns := &nodeStart{done: make(chan struct{})}
	go func() {
		defer close(ns.done)
		start := time.Now()
		ns.node, ns.err = startPrivateCluster(1, testenv.ClusterOptions{Script: script})
		ns.took = time.Since(start)
	}()
	return ns
}

// wait returns the node once it has started, or ctx's error.
func (ns *nodeStart) wait(ctx context.Context) (*privateCluster, time.Duration, error) {
	select {
	case <-ns.done:
		return ns.node, ns.took, ns.err
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
}

// close waits for the start to end and stops the node.
func (ns *nodeStart) close() {
	<-ns.done
	if ns.node != nil {
		if err := ns.node.close(); err != nil {
			fmt.Printf("  %s: stopping the private node: %v\n", orderedScenario, err)
		}
	}
}

func (ow *orderedWorld) describe(w *world) string {
	restarts := 0
	crashes := map[string]int{}
	for _, s := range w.procs {
		s.mu.Lock()
		restarts += s.restarts
		for k, v := range s.crashes {
			crashes[k] += v
		}
		s.mu.Unlock()
	}
	p := ow.plan
	twice := 0
	for _, n := range p.fail {
		if n == 2 {
			twice++
		}
	}
	restart := "no broker restart"
	if ow.restart >= 0 {
		restart = fmt.Sprintf("private broker restarted at %d effects (down %s from stop_app's return, serving again %s after stop_app; %s)", ow.restart, ow.down.Round(100*time.Millisecond), ow.restartTook.Round(100*time.Millisecond), ow.boot)
	}
	return fmt.Sprintf("%d keys × %d (%d messages: %d transient, %d of them twice, %d poisoned heads); %d SIGKILLs at %v effects, self-crashes before-commit %d, after-commit %d, after-tier-publish %d, %d restarts; %s; up to %d held at once; settled in %s",
		len(p.keys), p.perKey, len(p.publishes), len(p.fail), twice, len(p.poisonAt), len(ow.killsAt), ow.killsAt,
		crashes["before-commit"], crashes["after-commit"], crashes["after-tier-publish"], restarts, restart, ow.maxHeld, ow.settled.Round(100*time.Millisecond))
}

func (w *world) produceOrdered(ctx context.Context, events []orderedEvent) error {
	for i := 0; i < len(events); i += 100 {
		var batch []*message.Message
		for _, e := range events[i:min(i+100, len(events))] {
			b, err := json.Marshal(e)
			if err != nil {
				return err
			}
			m := message.NewMessage(watermill.NewUUID(), b)
			m.Metadata.Set(chaosIDKey, e.EventID)
			m.Metadata.Set(sluice.EventIDKey, e.EventID)
			m.SetContext(ctx)
			batch = append(batch, m)
		}
		if err := w.pub.Publish(w.topo.Config().Queue, batch...); err != nil {
			return err
		}
	}
	return nil
}

// disruptOrdered SIGKILLs the consumer process kills times, each at an
// even share of the reachable effects, and restarts the private broker
// halfway through, beside the kills.
func (w *world) disruptOrdered(ctx context.Context, ow *orderedWorld, rng *rand.Rand) error {
	oo := w.o.ordered
	total := ow.plan.reachable(false)
	reach := func(at int) (int, error) {
		var n int
		err := poll(ctx, w.o.timeout, 20*time.Millisecond, func() (bool, error) {
			var err error
			n, err = w.effects(ctx)
			return n >= at, err
		}, func() string { return fmt.Sprintf("%d effects", at) })
		return n, err
	}
	restarted := make(chan error, 1)
	go func() {
		if ow.node == nil {
			restarted <- nil
			return
		}
		n, err := reach(total / 2)
		if err != nil {
			restarted <- err
			return
		}
		ow.restart = n
		r, err := testenv.RestartApp(ctx, ow.node.NodeCtl(0), testenv.RabbitMQRoot, w.o.mqDown)
		ow.down, ow.restartTook, ow.boot = r.Down, r.Took, r.Boot
		if err != nil {
			err = fmt.Errorf("restarting the private RabbitMQ node: %w", err)
		}
		restarted <- err
	}()
	var errs []error
	for i := range oo.kills {
		n, err := reach(total * (i + 1) / (oo.kills + 2))
		if err != nil {
			errs = append(errs, err)
			break
		}
		// A moment later than the threshold, so kills land anywhere.
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		if w.procs[0].kill() {
			ow.killsAt = append(ow.killsAt, n)
		}
	}
	return errors.Join(append(errs, <-restarted)...)
}

// settleOrdered waits until every reachable effect exists, the poisoned
// heads are in the poison queue, the main and tier queues are empty and
// the ordering store is quiet: only the poisoned keys wait (none once
// skipped), each holding the messages after its head.
func (w *world) settleOrdered(ctx context.Context, ow *orderedWorld, skipped bool) error {
	want := ow.plan.reachable(skipped)
	wantHeld := 0
	if ow.control {
		want = len(ow.plan.publishes) - len(ow.plan.poisonAt)
	} else if !skipped {
		wantHeld = len(ow.plan.publishes) - len(ow.plan.poisonAt) - want
	}
	var last string
	return poll(ctx, w.o.timeout, 250*time.Millisecond, func() (bool, error) {
		var rows int
		if err := w.db.GetContext(ctx, &rows, "SELECT count(*) FROM "+w.name+".effects"); err != nil {
			return false, nil // the broker or the database may be restarting
		}
		_, poisoned, depth, err := w.observe(ctx)
		if err != nil {
			last = fmt.Sprintf("%d/%d effects; observing the queues: %v", rows, want, err)
			return false, nil
		}
		st, err := ow.store.Stats(ctx, orderedHandlerName)
		if err != nil {
			return false, nil
		}
		ow.maxHeld = max(ow.maxHeld, st.Held)
		last = fmt.Sprintf("%d/%d effects, %d/%d heads poisoned, %d in the main and tier queues, keys waiting %+v (want %d held)",
			rows, want, len(poisoned), len(ow.plan.poisonAt), depth, st, wantHeld)
		quiet := st.Blocked == 0 && st.Releasing == 0 && st.Held == wantHeld
		if !skipped {
			quiet = quiet && st.Poisoned == len(ow.plan.poisonAt)
		} else {
			quiet = quiet && st.Poisoned == 0
		}
		if ow.control {
			quiet = true
		}
		return rows >= want && len(poisoned) >= len(ow.plan.poisonAt) && depth == 0 && quiet, nil
	}, func() string { return "the run to settle: " + last })
}
