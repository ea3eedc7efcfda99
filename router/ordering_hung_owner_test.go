package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// hungOwnerEnv carries a hungOwner to the helper process, in JSON.
const hungOwnerEnv = "SLUICE_TEST_HUNG_OWNER"

// hungOwner is the ordered consumer of TestAHungOwnerHoldsAnOrderedKeyForABoundedTime:
// a partition (single active consumer) of key acct-1's messages, whose
// message 0 fails once (its key then holds the rest behind it) and whose
// message Hold, in the owner process, waits for a line on stdin.
type hungOwner struct {
	Schema   string
	Topology rabbitmq.TopologyConfig
	Hold     int
	// IdleTimeout is the ordering store's (sluicesql.OrdersConfig.IdleTimeout).
	IdleTimeout time.Duration
}

// The bounds of the test's consumers: a delivery's (Watermill's Timeout,
// which bounds the inbox's unit of work too) and the inbox's StoreTimeout.
const (
	hungOwnerTimeout      = 5 * time.Second
	hungOwnerStoreTimeout = 2 * time.Second
)

// run runs the consumer on db until ctx ends; hold, when set, is called
// before message Hold's effect, and settled after each delivery's stack.
func (h hungOwner) run(ctx context.Context, t testing.TB, db *sqlx.DB, hold func(), settled func(id string, err error)) (stop func()) {
	b, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: h.Topology})
	require.NoError(t, err)
	inbox, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: h.Schema + ".inbox"})
	require.NoError(t, err)
	store, err := sluicesql.NewOrders(db, sluicesql.OrdersConfig{TablePrefix: h.Schema + ".order", LockTimeout: time.Second, IdleTimeout: h.IdleTimeout})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if settled != nil {
				settled(msg.Metadata.Get(sluice.EventIDKey), err)
			}
			return out, err
		}
	}, wmiddleware.Timeout(hungOwnerTimeout))
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b, Name: "ledger",
		Handler: seqEffect(h.Schema, 0, func(seq int) {
			if seq == h.Hold && hold != nil {
				hold()
			}
		}),
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: inbox, Env: sluice.Env{StoreTimeout: hungOwnerStoreTimeout}},
			Recoverer: &stage.RecovererConfig{},
			Order:     &ordering.Config{Store: store, Key: sluice.KeyFromMetadata("account"), ResumeInterval: 200 * time.Millisecond},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	return func() { _ = r.Close(); <-done; _ = b.Close() }
}

// TestHungOwnerHelper is not a test of its own: run in a process of its
// own by TestAHungOwnerHoldsAnOrderedKeyForABoundedTime, it is the owner
// that test stops with SIGSTOP. It prints HOLD when message Hold's handler
// waits on stdin, SETTLED <event id> <error> after each delivery's stack,
// and runs until it is killed.
func TestHungOwnerHelper(t *testing.T) {
	raw := os.Getenv(hungOwnerEnv)
	if raw == "" {
		t.Skip("the owner process of TestAHungOwnerHoldsAnOrderedKeyForABoundedTime")
	}
	var h hungOwner
	require.NoError(t, json.Unmarshal([]byte(raw), &h))
	db, err := sqlx.Connect("postgres", testenv.PostgresURL)
	require.NoError(t, err)
	stdin := bufio.NewReader(os.Stdin)
	h.run(context.Background(), t, db, func() {
		fmt.Println("HOLD")
		_, _ = stdin.ReadString('\n')
	}, func(id string, err error) { fmt.Printf("SETTLED %s %v\n", id, err != nil) })
	select {} // until killed
}

// Issue 43, item 3: an ordered key whose owner hangs mid-release — stopped
// with SIGSTOP inside a held message's handler, holding the key's lock
// (the ordering store's unit of work) and the message's claim (the
// inbox's) in transactions that sit idle — is taken over by the
// partition's standby within a bound: PostgreSQL ends both once they idle
// past their limits (sluicesql.OrdersConfig.IdleTimeout; the delivery's deadline
// plus StoreTimeout for the inbox's, deduplication.IdleBounder), and the
// standby's Run releases the rest, in order. After SIGCONT the owner's
// leftovers change nothing: each message applied once, in order. Before,
// the key did not move for as long as the owner was stopped (90 s in the
// issue's run, the standby logging 55P03 every 5 s).
func TestAHungOwnerHoldsAnOrderedKeyForABoundedTime(t *testing.T) {
	t.Parallel()
	const n, hold = 30, 15
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s.applied (n bigserial PRIMARY KEY, seq int NOT NULL)`, schema))
	require.NoError(t, err)
	testenv.SQLStore(t, db, schema+".inbox")
	orders := testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Order: sluicesql.OrdersConfig{TablePrefix: "order"}}).Order
	h := hungOwner{Schema: schema, Hold: hold, IdleTimeout: 10 * time.Second,
		Topology: rabbitmq.TopologyConfig{Queue: testenv.Name("hung_owner"), TierDelays: []time.Duration{3 * time.Second},
			Partitions: 1, PartitionKey: "account"}}
	topo, err := rabbitmq.NewTopology(h.Topology)
	require.NoError(t, err)
	names := []string{"exchange:" + topo.Config().Exchange}
	for _, q := range topo.Queues() {
		names = append(names, q.Name)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	pub, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: h.Topology})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for seq := range n {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("acct-1-%d", seq))
		m.Metadata.Set("account", "acct-1")
		m.Metadata.Set("seq", fmt.Sprint(seq))
		require.NoError(t, pub.PartitionPublisher().Publish(topo.Config().Exchange, m))
	}

	// The owner, A: a process of its own, consuming first.
	cfg, err := json.Marshal(h)
	require.NoError(t, err)
	owner := exec.Command(os.Args[0], "-test.run=^TestHungOwnerHelper$", "-test.count=1")
	owner.Env = append(os.Environ(), hungOwnerEnv+"="+string(cfg))
	owner.Stderr = os.Stderr
	stdin, err := owner.StdinPipe()
	require.NoError(t, err)
	stdout, err := owner.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, owner.Start())
	stopped := false
	t.Cleanup(func() {
		if stopped {
			_ = owner.Process.Signal(syscall.SIGCONT)
		}
		_ = owner.Process.Kill()
		_ = owner.Wait()
	})
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	await := func(prefix string, within time.Duration) string {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case l, ok := <-lines:
				require.True(t, ok, "the owner process ended before %q", prefix)
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-deadline:
				t.Fatalf("the owner process did not print %q within %s", prefix, within)
			}
		}
	}
	applied := func() []int {
		var s []int
		require.NoError(t, db.Select(&s, fmt.Sprintf(`SELECT seq FROM %s.applied ORDER BY n`, schema)))
		return s
	}
	await("HOLD", 2*time.Minute)
	keys, err := orders.Keys(t.Context(), "ledger-p0", 10)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, n-1, keys[0].Held, "29 held behind message 0, as committed: the release's unblock and removals are in A's open transaction")
	require.Equal(t, seqs(0, hold), applied(), "A released 1–14 and runs 15")

	// The standby, B, attached; then A stops, holding the key and 15's claim.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stopB := h.run(ctx, t, db, nil, nil)
	t.Cleanup(stopB)
	require.NoError(t, owner.Process.Signal(syscall.SIGSTOP))
	stopped = true
	start := time.Now()
	require.Eventually(t, func() bool { return len(applied()) == n }, 3*time.Minute, 50*time.Millisecond,
		"B takes the key over while A is stopped")
	t.Logf("B applied 15–29 %s after A stopped (the ordering store's IdleTimeout %s; the inbox's unit of work idles at most %s + %s + 1 s)",
		time.Since(start).Round(time.Millisecond), h.IdleTimeout, hungOwnerTimeout, hungOwnerStoreTimeout)
	require.Equal(t, seqs(0, n), applied(), "in order, each once")

	// A goes on: its handler returns into transactions PostgreSQL ended.
	require.NoError(t, owner.Process.Signal(syscall.SIGCONT))
	stopped = false
	_, err = io.WriteString(stdin, "go\n")
	require.NoError(t, err)
	await("SETTLED acct-1-0", 2*time.Minute) // the delivery that ran A's release returned
	require.Eventually(t, func() bool {
		keys, err := orders.Keys(t.Context(), "ledger-p0", 10)
		require.NoError(t, err)
		return len(keys) == 0 && testenv.QueueDepth(t, testenv.AMQP(t), topo.Partitions()[0].Config().Queue) == 0 &&
			testenv.QueueDepth(t, testenv.AMQP(t), topo.Partitions()[0].Tiers()[0].Topic) == 0
	}, 2*time.Minute, 50*time.Millisecond, "nothing held, nothing left to deliver")
	require.Equal(t, seqs(0, n), applied(), "after SIGCONT: still in order, each once")
}

// seqEffect is the ordered handlers' effect: it inserts the message's seq
// into <schema>.applied in the inbox's transaction; message failsOnce fails
// its first attempt (Transient: to a tier, its key holding the rest), and
// before, when set, is called before each effect.
func seqEffect(schema string, failsOnce int, before func(seq int)) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		var seq int
		if _, err := fmt.Sscan(msg.Metadata.Get("seq"), &seq); err != nil {
			return sluice.Poison(err)
		}
		attempt, err := sluice.Attempt(msg)
		if err != nil {
			return err
		}
		if seq == failsOnce && attempt < 2 {
			return sluice.Transient(fmt.Errorf("seq %d attempt %d: %w", seq, attempt, context.DeadlineExceeded))
		}
		if before != nil {
			before(seq)
		}
		_, err = sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
			fmt.Sprintf(`INSERT INTO %s.applied (seq) VALUES ($1)`, schema), seq)
		return err
	}
}
