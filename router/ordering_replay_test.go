package router_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// Issue 43, item 6: a key's poisoned head, skipped (ordering.Skip: what
// the key held is released without it), then replayed from the poison
// queue, applies after its key's later messages (0 1 3 4 2). It still
// applies — the operator asked for it — but no longer silently: the stage
// logs it, and the replay's outcome record (what the console's run page
// and sluice dlq report show) carries the note. Before, nothing said so.
func TestAReplayedHeadAfterItsSkipIsSaidToBeOutOfOrder(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s.applied (n bigserial PRIMARY KEY, seq int NOT NULL)`, schema))
	require.NoError(t, err)
	inbox := testenv.SQLStore(t, db, schema+".inbox")
	outcomes := testenv.OutcomeStore(t, db, schema+".sluice_replay")
	store := testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Order: sluicesql.OrdersConfig{TablePrefix: "order"}}).Order
	queue := testenv.Name("ordered_replay")
	tc := rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{50 * time.Millisecond}}
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: tc})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	testenv.DeleteQueuesAtEnd(t, queue, b.Topology().Config().PoisonQueue, b.Topology().Tiers()[0].Topic)

	var logs testenv.SyncBuffer
	var broken atomic.Bool
	broken.Store(true)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b,
		Name:   "ledger",
		Handler: func(msg *message.Message) error {
			var seq int
			if _, err := fmt.Sscan(msg.Metadata.Get("seq"), &seq); err != nil {
				return sluice.Poison(err)
			}
			if seq == 2 && broken.Load() {
				return sluice.Poison(errors.New("unknown account version"))
			}
			_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), fmt.Sprintf(`INSERT INTO %s.applied (seq) VALUES ($1)`, schema), seq)
			return err
		},
		Stages: router.Stages{
			Replay: &replay.Config{Store: outcomes},
			Order: &ordering.Config{Store: store, Key: sluice.KeyFromMetadata("account"), ResumeInterval: 100 * time.Millisecond,
				Env: sluice.Env{Logger: watermill.NewStdLoggerWithOut(&logs, false, false)}},
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Inbox: &deduplication.Config{Store: inbox},
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	<-r.Running()

	for seq := range 5 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("a-", seq))
		m.Metadata.Set("account", "a")
		m.Metadata.Set("seq", fmt.Sprint(seq))
		require.NoError(t, b.Publisher().Publish(queue, m))
	}
	applied := func() []int {
		var s []int
		require.NoError(t, db.Select(&s, fmt.Sprintf(`SELECT seq FROM %s.applied ORDER BY n`, schema)))
		return s
	}
	wait := func(cond func() bool, what string) {
		t.Helper()
		require.Eventually(t, cond, 60*time.Second, 20*time.Millisecond, what)
	}
	wait(func() bool {
		keys, err := store.Keys(t.Context(), "ledger", 10)
		require.NoError(t, err)
		return len(keys) == 1 && keys[0].Poisoned && keys[0].Held == 2
	}, "the key waits for its poisoned head a-2, holding a-3 and a-4")
	require.Equal(t, []int{0, 1}, applied())
	_, skipped, err := ordering.Skip(t.Context(), store, "ledger", "a")
	require.NoError(t, err)
	require.True(t, skipped)
	wait(func() bool { return len(applied()) == 4 }, "the held messages released without their head")
	require.NotContains(t, logs.String(), "out of its key's order", "nothing replayed yet")

	broken.Store(false) // the fix landed; the operator replays the skipped head
	res, err := dlq.Open(testenv.AMQP(t), b.Topology().Config().PoisonQueue, dlq.Config{Publisher: b.Publisher(), Operator: "tester"}).Replay(t.Context(),
		dlq.ReplayConfig{Run: "run-43"})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	wait(func() bool { return len(applied()) == 5 }, "the replayed head applied")
	require.Equal(t, []int{0, 1, 3, 4, 2}, applied(), "after its key's later messages: what the warning is about")

	// Logged once the delivery's outcome is known, after its commit: waited for.
	wait(func() bool { return strings.Contains(logs.String(), "A replayed message runs out of its key's order") }, "the warning logged")
	log := logs.String()
	require.Contains(t, log, "event_id=a-2")
	require.Contains(t, log, "replayed_from="+b.Topology().Config().PoisonQueue)
	var recs []replay.Record
	wait(func() bool {
		recs, err = outcomes.Outcomes(t.Context(), "run-43")
		require.NoError(t, err)
		return len(recs) == 1 && recs[0].Outcome == sluice.OutcomeProcessed
	}, "the replay's outcome")
	require.True(t, strings.Contains(recs[0].Reason, "out of its key's order"), "the outcome record says so: %q", recs[0].Reason)
}
