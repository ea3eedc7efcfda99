package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/testenv"
)

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
		w.traces.add(harnessTrace, time.Now().Format("15:04:05.000")+" rabbitmqctl stop_app")
		r, err := testenv.RestartApp(ctx, testenv.TryRabbitmqctl, testenv.RabbitMQRoot, w.o.mqDown)
		w.traces.add(harnessTrace, time.Now().Format("15:04:05.000")+" the broker serves again (start_app returned)")
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
	script, err := testenv.FindAbove("scripts/rabbitmq4.sh")
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
	q := w.topo.Config().PoisonQueue
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
