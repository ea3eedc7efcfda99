package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// clusterScenario runs on a private 3-node cluster with quorum queues: the
// node leading the main queue is SIGKILLed and started again, then the one
// leading the first retry tier, while that tier holds copies.
const clusterScenario = "cluster-node-kill"

// clusterSize is the private cluster's: the smallest whose quorum queues
// survive the loss of a node.
const clusterSize = 3

// clusterWaitTimeout bounds each wait on the cluster: consumption resuming
// after a kill, every member of a queue online again after a restart, a
// tier's first copy.
const clusterWaitTimeout = 90 * time.Second

// clusterWorld is the cluster scenario's part of the world.
type clusterWorld struct {
	c *privateCluster
	// rest are the publishes held back until the first node killed is
	// back, so that the tier has copies when its leader is killed.
	rest []publish
	// reachable is how many valid events the publishes so far carry: the
	// effects cannot pass it before the rest is published.
	reachable int
	// inflight bounds the deliveries the consumers hold unacked at once:
	// effects beyond the count at a kill plus inflight come from deliveries
	// taken after it.
	inflight int
	kills    []*nodeKill
	// leaders are the queues' leaders, read before the consumers start
	// and again before the second kill: rabbitmqctl takes a second or more
	// to answer, long enough for a short run to be over.
	leaders map[string]queueState
	// drained are the queues whose copies are the broker's to keep, read
	// once (brokerDrained).
	drained map[string]bool
}

// nodeKill is what the harness saw of one SIGKILL of a node.
type nodeKill struct {
	node       int      // 0-based
	led        []string // the scenario's queues it led, as queueLabel names them
	queues     []string // the same queues, by name
	at         int      // effects at the kill
	tierCopies int      // copies in the first tier at the kill
	first      time.Duration
	resumed    time.Duration // kill → the (at+inflight+1)th effect
	back       time.Duration // the restart, until the node booted
	rejoined   time.Duration // the restart's end → every member online
	// when and restarted are the kill's and the restart's wall-clock
	// moments, for the diagnostics (the consumers' trace lines have them);
	// online, when the node was back in every queue (zero until then).
	when, restarted, online time.Time
}

// startCluster starts the private cluster and points the world at it:
// quorum queues, every connection given the three nodes.
func (w *world) startCluster(ctx context.Context, batched bool) error {
	if w.o.subscriber != "sluice" {
		return fmt.Errorf("%s needs --subscriber sluice: watermill-amqp's subscriber connects to one node", clusterScenario)
	}
	start := time.Now()
	c, err := startPrivateCluster(clusterSize, testenv.ClusterOptions{Script: w.o.clusterScript, DeadLetterConfirmTimeout: w.o.dlxConfirmTimeout})
	if err != nil {
		return err
	}
	fmt.Printf("  %s: private cluster of %d nodes started in %s\n", clusterScenario, clusterSize, time.Since(start).Round(100*time.Millisecond))
	prefetch := rabbitmqPrefetch
	if batched && w.o.batchPrefetch > 0 {
		prefetch = w.o.batchPrefetch
	}
	w.cl = &clusterWorld{c: c, inflight: w.o.procs * cmp.Or(w.o.consumers, 1) * prefetch}
	// The harness's connections start on the second node: the topology's
	// queues are led by it (RabbitMQ's leader locator is client-local)
	// until placeMainQueue moves the main queue to the first.
	w.conn = rabbitmq.Connection{URLs: append(c.URLs[1:len(c.URLs):len(c.URLs)], c.URLs[0]), DialTimeout: 5 * time.Second}
	w.quorum = true
	return nil
}

// stopCluster stops the private cluster and removes its files.
func (w *world) stopCluster() {
	if w.cl == nil {
		return
	}
	if err := w.cl.c.close(); err != nil {
		fmt.Printf("  %s: stopping the private cluster: %v\n", clusterScenario, err)
	}
}

// placeMainQueue declares the main queue alone through the first node,
// before the topology is declared through the second: the first node then
// leads the main queue and the second the tiers and the poison queue
// (RabbitMQ's leader locator is client-local), so the two kills hit
// different queues' leaders. The queue is declared with the arguments the
// topology declares it with (Topology.Plan), so the topology's
// own declaration finds it as it would declare it. (Deleting the queue and
// declaring it again through another node instead left its member on a
// killed node offline after the node's restart, on RabbitMQ 3.10.)
func (w *world) placeMainQueue(ctx context.Context) error {
	var args amqp.Table
	for _, d := range w.topo.Plan().Queues {
		if d.Name != w.topo.Config().Queue {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(d.Arguments))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			return err
		}
		args = amqp.Table{}
		for k, v := range m {
			if n, ok := v.(json.Number); ok {
				if v, err := n.Int64(); err == nil {
					args[k] = v
					continue
				}
			}
			args[k] = v
		}
	}
	if args == nil {
		return fmt.Errorf("the topology does not declare %s", w.topo.Config().Queue)
	}
	c, err := rabbitmq.Dial(rabbitmq.Connection{URL: w.cl.c.URLs[0], DialTimeout: 5 * time.Second}, "sluice chaos")
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	_, err = ch.QueueDeclare(w.topo.Config().Queue, true, false, false, false, args)
	return err
}

// clusterPlan splits the publishes: the first half before the consumers
// start, the rest once the first node killed is back.
func (w *world) clusterPlan(p plan) []publish {
	half := len(p.publishes) / 2
	w.cl.rest = p.publishes[half:]
	w.cl.reachable = validIn(p, p.publishes[:half])
	return p.publishes[:half]
}

// validIn counts the distinct valid events of publishes.
func validIn(p plan, publishes []publish) int {
	ids := map[string]bool{}
	for _, pub := range publishes {
		if p.valid[pub.id] {
			ids[pub.id] = true
		}
	}
	return len(ids)
}

// readLeaders reads the leaders of the scenario's queues.
func (w *world) readLeaders(ctx context.Context) error {
	var err error
	w.cl.leaders, err = w.cl.c.queues(0, w.queues(true)...)
	return err
}

// disruptCluster kills the main queue's leader, waits until consumption
// resumes, starts it again and waits until it is back in every queue;
// then publishes the rest of the plan, waits for the first tier's copies,
// and does the same to that tier's leader.
func (w *world) disruptCluster(ctx context.Context) error {
	main, tier := w.topo.Config().Queue, w.topo.Tiers()[0].Topic
	if err := w.killLeader(ctx, main); err != nil {
		return w.withQueueStates(err)
	}
	if err := w.readLeaders(ctx); err != nil {
		return err
	}
	if err := w.produce(ctx, w.cl.rest); err != nil {
		return fmt.Errorf("publishing the rest: %w", err)
	}
	w.cl.reachable = w.total
	if err := w.awaitTierCopies(ctx, tier); err != nil {
		return w.withQueueStates(err)
	}
	if err := w.killLeader(ctx, tier); err != nil {
		return w.withQueueStates(err)
	}
	if w.o.injectDrop {
		return w.dropAPoisonCopy(ctx)
	}
	return nil
}

// dropAPoisonCopy takes out of the poison queue the copy of a bad event
// that has only one there, confirmed while the queue's leader was down or
// catching up (one the broker could have lost: lossRule), once there is
// one (bounded), as a broker that lost it would (-inject-broker-drop).
func (w *world) dropAPoisonCopy(ctx context.Context) error {
	var id string
	err := poll(ctx, clusterWaitTimeout, 200*time.Millisecond, func() (bool, error) {
		_, poisoned, _, err := w.observe(ctx)
		if err != nil {
			return false, nil // a node restarting: look again
		}
		ids := slices.Sorted(maps.Keys(poisoned))
		i := slices.IndexFunc(ids, func(id string) bool { return poisoned[id] == 1 && len(w.droppedBad([]string{id})) == 1 })
		if i >= 0 {
			id = ids[i]
		}
		return i >= 0, nil
	}, func() string {
		return "a bad event with one copy in the poison queue, confirmed before the node leading it was back in every queue, to drop"
	})
	if err != nil {
		return err
	}
	w.queueMu.Lock() // observe must not count the queue while its messages are out
	defer w.queueMu.Unlock()
	return w.withConn(func(c *amqp.Connection) error {
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }() // returns what was read and not acked
		for {
			d, ok, err := ch.Get(w.topo.Config().PoisonQueue, false)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("-inject-broker-drop: %s's poison copy not found", id)
			}
			if d.Headers[chaosIDKey] == id {
				w.traces.add(harnessTrace, time.Now().Format("15:04:05.000")+" injected: dropped the poison copy of "+id)
				fmt.Printf("  -inject-broker-drop: dropped the poison copy of %s\n", id)
				return d.Ack(false)
			}
		}
	})
}

// withQueueStates adds to err what the cluster's live nodes report of the
// scenario's queues.
func (w *world) withQueueStates(err error) error {
	if err == nil {
		return nil
	}
	for i := range w.cl.c.Nodes {
		out, qerr := w.cl.c.TryCtl(i, "list_queues", "name", "leader", "online",
			"messages_ready", "messages_unacknowledged", "consumers")
		if qerr == nil {
			return fmt.Errorf("%w; node %d reports:\n%s", err, i+1, out)
		}
	}
	return err
}

// killLeader SIGKILLs the node leading queue and starts it again.
func (w *world) killLeader(ctx context.Context, queue string) error {
	c, states := w.cl.c, w.cl.leaders
	k := &nodeKill{node: states[queue].leader}
	if k.node < 0 {
		return fmt.Errorf("queue %s has no leader among the cluster's nodes", queue)
	}
	w.cl.kills = append(w.cl.kills, k)
	for _, q := range w.queues(true) {
		if states[q].leader == k.node {
			k.led = append(k.led, w.queueLabel(q))
			k.queues = append(k.queues, q)
		}
	}
	k.tierCopies, _ = w.depth(ctx, w.topo.Tiers()[0].Topic)
	var err error
	if k.at, err = w.effects(ctx); err != nil {
		return err
	}
	gone, err := c.kill(k.node)
	if err != nil {
		return err
	}
	killed := time.Now()
	k.when = killed
	if err := w.awaitResumed(ctx, k, killed); err != nil {
		return err
	}
	// Started again only once the VM has exited (bounded: a VM that
	// outlives a SIGKILL is a machine gone wrong).
	if err := poll(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) { return gone(), nil },
		func() string { return fmt.Sprintf("node %d's VM to exit after SIGKILL", k.node+1) }); err != nil {
		return err
	}
	restart := time.Now()
	k.restarted = restart
	if err := c.start(ctx, k.node); err != nil {
		return err
	}
	k.back = time.Since(restart)
	booted := time.Now()
	if err := w.awaitOnline(ctx, k.node); err != nil {
		return err
	}
	k.online = time.Now()
	k.rejoined = k.online.Sub(booted)
	return nil
}

// awaitResumed polls the effects (every 20 ms, bounded) until one more
// than the deliveries in flight at the kill exist after it — or all of
// them.
func (w *world) awaitResumed(ctx context.Context, k *nodeKill, killed time.Time) error {
	target := min(k.at+w.cl.inflight+1, w.cl.reachable)
	return poll(ctx, clusterWaitTimeout, 20*time.Millisecond, func() (bool, error) {
		n, err := w.effects(ctx)
		if err != nil {
			return false, nil // PostgreSQL is not disrupted here: try again
		}
		if n > k.at && k.first == 0 {
			k.first = time.Since(killed)
		}
		if n >= target {
			k.resumed = time.Since(killed)
			return true, nil
		}
		return false, nil
	}, func() string {
		n, _ := w.effects(ctx)
		return fmt.Sprintf("consumption to resume after node %d's kill: %d effects, waiting for %d", k.node+1, n, target)
	})
}

// awaitOnline polls until node is an online member of every quorum queue
// of the scenario again.
func (w *world) awaitOnline(ctx context.Context, node int) error {
	var last string
	return poll(ctx, clusterWaitTimeout, 250*time.Millisecond, func() (bool, error) {
		states, err := w.cl.c.queues(node, w.queues(true)...)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, q := range w.queues(true) {
			if !w.cl.c.allOnline(states[q]) {
				last = fmt.Sprintf("queue %s: members online %s", q, states[q].online)
				return false, nil
			}
		}
		return true, nil
	}, func() string { return fmt.Sprintf("node %d to be back in every queue (%s)", node+1, last) })
}

// awaitTierCopies polls until tier holds a copy, or every valid event has
// its effect (a plan too small to have a transient event left).
func (w *world) awaitTierCopies(ctx context.Context, tier string) error {
	return poll(ctx, clusterWaitTimeout, 20*time.Millisecond, func() (bool, error) {
		if d, err := w.depth(ctx, tier); err == nil && d > 0 {
			return true, nil
		}
		n, err := w.effects(ctx)
		return err == nil && n >= w.total, nil
	}, func() string { return "a copy in " + tier })
}

// poll calls cond every interval until it is true, it fails, ctx ends or
// timeout passes; what names the wait in the timeout's error.
func poll(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error), what func() string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waited %s for %s: %w", timeout, what(), ctx.Err())
		case <-time.After(interval):
		}
	}
}

// effects counts the distinct events with an effect.
func (w *world) effects(ctx context.Context) (int, error) {
	var n int
	err := w.db.GetContext(ctx, &n, "SELECT count(DISTINCT event_id) FROM "+w.name+".effects")
	return n, err
}

// depth returns how many messages queue holds, through any node that
// answers.
func (w *world) depth(ctx context.Context, queue string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int
	err := w.withConn(func(c *amqp.Connection) error {
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		// A queue without a leader may keep the declare waiting: bounded
		// here, and the deferred closes end the goroutine.
		type result struct {
			n   int
			err error
		}
		done := make(chan result, 1)
		go func() {
			info, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			done <- result{info.Messages, err}
		}()
		select {
		case r := <-done:
			n = r.n
			return r.err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return n, err
}

// queueLabel names one of the scenario's queues for the summary line.
func (w *world) queueLabel(q string) string {
	switch q {
	case w.topo.Config().Queue:
		return "the main queue"
	case w.topo.Config().PoisonQueue:
		return "the poison queue"
	}
	for _, t := range w.topo.Tiers() {
		if t.Topic == q {
			return "tier " + t.Delay.String()
		}
	}
	return q
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// describe is the cluster scenario's part of the summary line.
func (cw *clusterWorld) describe(procs, restarts int) string {
	if cw == nil {
		return ""
	}
	var parts []string
	for i, k := range cw.kills {
		what := fmt.Sprintf("node %d (leading %s)", k.node+1, strings.Join(k.led, ", "))
		if i > 0 {
			what += fmt.Sprintf(" with %s in the first tier", plural(k.tierCopies, "copy", "copies"))
		}
		parts = append(parts, fmt.Sprintf("%s SIGKILLed at %d effects: first effect %s after, recovered in %s (effects past the %d deliveries in flight), started again in %s, in every queue %s later",
			what, k.at, k.first.Round(10*time.Millisecond), k.resumed.Round(10*time.Millisecond), cw.inflight,
			k.back.Round(100*time.Millisecond), k.rejoined.Round(100*time.Millisecond)))
	}
	if len(parts) == 0 {
		parts = append(parts, "no node killed")
	}
	return fmt.Sprintf("quorum queues on %d nodes, %d consumer processes each starting on another node; %s; %d consumer restarts",
		clusterSize, procs, strings.Join(parts, "; "), restarts)
}
