package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// fixable is a consumer of the bed's queue whose key function and handler
// two fixes change: before the first, the key is read from "eventId" (the
// producer writes "event_id": the key is missing, the message poisoned
// before the handler, with no event id), after it from "event_id"; before
// the second, the handler poisons events marked "bad". It records replays' outcomes into schema.sluice_replay.
type fixable struct {
	keyFixed, handlerFixed atomic.Bool
	schema                 string
	outcome                string // the outcome table
}

func newFixable(t *testing.T, b *bed) *fixable {
	t.Helper()
	db := testenv.Postgres(t)
	f := &fixable{schema: testenv.Schema(t, db)}
	f.outcome = f.schema + ".sluice_replay"
	outcomes := testenv.OutcomeStore(t, db, f.outcome)
	before, after := sluice.KeyFromJSON("eventId"), sluice.KeyFromJSON("event_id")
	sub, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Name: "stock", Topic: b.topo.Config().Queue, Subscriber: sub,
		Handler: func(msg *message.Message) error {
			if !f.handlerFixed.Load() && strings.Contains(string(msg.Payload), `"bad":true`) {
				return sluice.Poison(errors.New("unknown schema version 3"))
			}
			return nil
		},
		Stages: router.Stages{
			Replay:   &replay.Config{Store: outcomes, InUnitOfWork: true},
			Poison:   &poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue},
			Retry:    &retrytiers.Config{Publisher: b.pub, Tiers: b.topo.Tiers()},
			Classify: &stage.ClassifyConfig{},
			Inbox: &deduplication.Config{Store: testenv.SQLStore(t, db, f.schema+".inbox"), Consumer: "stock",
				Key: func(msg *message.Message) (string, error) {
					if f.keyFixed.Load() {
						return after(msg)
					}
					return before(msg)
				}},
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })
	return f
}

var runOf = regexp.MustCompile(`replay run (run-\S+)`)

// One dead letter, one name: a message isolated before its key was read
// (no event id) is "dead letter <its id>" in sluice dlq inspect, on the
// console's group page, and — replayed by the CLI once the key is fixed —
// on the run's page of a console started after the run, followed there by
// the event id the fixed consumer took ("· event evt-9"). A later run's
// outcome shows from the earlier run's row in sluice dlq report. Before:
// inspect said "(position 1)" and message id "-", the group page the
// copy's id, the run page the consumer's key alone; the run was "no such
// run in this console's memory"; the report listed evt-5 poisoned with no
// word of the run that processed it.
func TestADeadLetterHasOneNameEverywhere(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	f := newFixable(t, b)
	pq := b.topo.Config().PoisonQueue
	require.NoError(t, b.pub.Publish(b.topo.Config().Queue, message.NewMessage(watermill.NewUUID(), []byte(`{"event_id":"evt-9"}`))))
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), pq) == 1 }, 2*time.Minute, 10*time.Millisecond)

	code, out, errOut := b.cli(t, "dlq", "inspect", "--queue", pq, "--json")
	require.Equal(t, 0, code, errOut)
	var rec struct {
		Name       string `json:"name"`
		EventID    string `json:"event_id"`
		DeadLetter string `json:"dead_letter"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &rec))
	require.Empty(t, rec.EventID, "isolated before its key was read")
	require.NotEmpty(t, rec.DeadLetter)
	name := "dead letter " + rec.DeadLetter
	require.Equal(t, name, rec.Name)
	code, out, errOut = b.cli(t, "dlq", "inspect", "--queue", pq)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1. poison ("+name+")")

	ctx := browser(t)
	before, _ := consoleOn(t, b, f.outcome, nil)
	do(t, ctx, chromedp.Navigate(before+"/q/"+pq+"/g/"+groupOf(t, pq, "")), chromedp.WaitVisible("details.message strong.name"))
	require.Equal(t, name, textOf(t, ctx, "details.message strong.name"), "the group page names it as inspect does")

	// The fix lands; the CLI replays it; a console started afterwards shows the run.
	f.keyFixed.Store(true)
	code, out, errOut = b.cli(t, "dlq", "replay", "--queue", pq, "--canary", "1", "--outcomes", testenv.PostgresURL,
		"--outcomes-table", f.outcome, "--wait", outcomeWait)
	require.Equal(t, 0, code, out+errOut)
	runA := runOf.FindStringSubmatch(out)
	require.Len(t, runA, 2, out)
	after, _ := consoleOn(t, b, f.outcome, nil)
	do(t, ctx, chromedp.Navigate(after+"/runs/"+runA[1]), chromedp.WaitVisible("#outcomes td.name"))
	require.Equal(t, name+" · event evt-9", textOf(t, ctx, "#outcomes td.name"), "the run page names it as the group page did, with the key the fixed consumer took")
	require.Equal(t, "processed", textOf(t, ctx, "#outcomes td.outcome"))
	require.Equal(t, "Done.", textOf(t, ctx, "#state"), "the run as the CLI ended it")
	require.Contains(t, textOf(t, ctx, "main"), "(cli)", "a run the CLI started")
	do(t, ctx, chromedp.Navigate(after+"/"), chromedp.WaitVisible("table.queues"))
	require.Contains(t, textOf(t, ctx, "main"), runA[1], "among the recent actions of a console that did not start it")

	// A later run's outcome, seen from the earlier run's row: evt-5 is
	// poisoned by the handler, poisoned again by run B, processed by run C
	// once the handler is fixed.
	require.NoError(t, b.pub.Publish(b.topo.Config().Queue, message.NewMessage(watermill.NewUUID(), []byte(`{"event_id":"evt-5","bad":true}`))))
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), pq) == 1 }, 2*time.Minute, 10*time.Millisecond)
	replayed := func(want int) string {
		t.Helper()
		code, out, errOut := b.cli(t, "dlq", "replay", "--queue", pq, "--canary", "1", "--outcomes", testenv.PostgresURL, "--outcomes-table", f.outcome, "--wait", outcomeWait)
		require.Equal(t, want, code, out+errOut)
		run := runOf.FindStringSubmatch(out)
		require.Len(t, run, 2, out)
		return run[1]
	}
	runB := replayed(1) // poisoned again: stopped
	f.handlerFixed.Store(true)
	runC := replayed(0)
	code, report, errOut := b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", f.outcome, "--run", runB)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, report, "event evt-5\tpoisoned")
	require.Contains(t, report, "→ processed in run "+runC, report)
}
