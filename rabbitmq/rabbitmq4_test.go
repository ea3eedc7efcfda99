package rabbitmq_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// What changes with RabbitMQ 4.x (docs/rabbitmq.md). These tests run on the
// broker under test: the machine's 3.10 with make test, the 4.0 node with
// make test-rabbitmq4. They assert what each version does.

// rabbitmq43Refuses are the queue arguments RabbitMQ 4.3 refuses to declare
// (release-notes/4.3.0.md, "Classic Queues v1 Storage (CQv1) is Removed"):
// x-queue-mode with any value, x-queue-version 1.
func rabbitmq43Refuses(args map[string]any) string {
	if _, ok := args["x-queue-mode"]; ok {
		return "x-queue-mode"
	}
	if v, ok := args["x-queue-version"]; ok && v == float64(1) {
		return "x-queue-version 1"
	}
	return ""
}

// Sluice declares nothing RabbitMQ 4.3 refuses: no queue argument 4.3
// removed, and every queue durable (4.3 refuses a transient non-exclusive
// queue; the 4.0 node of make test-rabbitmq4 is configured to refuse it
// too, as deprecated_features.permit.transient_nonexcl_queues = false). Each
// topology shape is declared on the broker under test, whose rabbitmqctl
// then lists every queue durable and not exclusive.
func TestTopologyDeclaresNothingRabbitMQ43Refuses(t *testing.T) {
	t.Parallel()
	shapes := map[string]rabbitmq.TopologyConfig{
		"classic":        {TierDelays: []time.Duration{time.Second, time.Minute}},
		"quorum":         {Quorum: true, TierDelays: []time.Duration{time.Second}},
		"quorum limited": {Quorum: true, DeliveryLimit: 5, TierDelays: []time.Duration{time.Second}},
		"jitter":         {TierDelays: []time.Duration{time.Minute}, TierJitter: broker.Jitter{Fraction: 0.5, Queues: 3}},
		"exchange":       {Exchange: testenv.Name("ex"), BindingKey: "orders.created", TierDelays: []time.Duration{time.Second}},
	}
	if testenv.RabbitMQMajor(t) >= 4 {
		// The control: the broker refuses what 4.3 refuses.
		ch := testenv.Channel(t, testenv.AMQP(t))
		transient := testenv.Name("transient")
		_, err := ch.QueueDeclare(transient, false, false, false, false, nil)
		testenv.DeleteQueuesAtEnd(t, transient)
		require.Error(t, err, "RabbitMQ %s refuses a transient non-exclusive queue (make services configures the 4.0 node so)", testenv.RabbitMQVersion(t))
	}
	declared := map[string]bool{}
	for name, cfg := range shapes {
		topo := newTopology(t, cfg)
		for _, d := range topo.Plan().Queues {
			var args map[string]any
			require.NoError(t, json.Unmarshal([]byte(d.Arguments), &args))
			require.Empty(t, rabbitmq43Refuses(args), "%s: %s is declared with an argument RabbitMQ 4.3 refuses: %s", name, d.Name, d.Arguments)
			declared[d.Name] = true
		}
	}
	// One rabbitmqctl for every shape: each starts an Erlang VM.
	listed := 0
	for line := range strings.SplitSeq(testenv.Rabbitmqctl(t, "-q", "list_queues", "--no-table-headers", "name", "durable", "exclusive"), "\n") {
		// A quorum queue (always durable, never exclusive) lists no
		// exclusive column.
		f := strings.Fields(line)
		if len(f) < 2 || !declared[f[0]] {
			continue
		}
		listed++
		require.Equal(t, "true", f[1], "%s is durable", f[0])
		if len(f) > 2 {
			require.Equal(t, "false", f[2], "%s is not exclusive", f[0])
		}
	}
	require.Equal(t, len(declared), listed, "every queue of the topology is on the broker under test")
}

// Sluice never asks for global QoS (basic.qos with global true), which
// RabbitMQ 4.3 refuses with a channel error: every Qos call in the
// library's code (the vendored AMQP client aside, which passes its
// caller's choice) passes a literal false.
func TestNoGlobalQoS(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	calls := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == filepath.Join("internal", "amqp091") || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Qos" || len(call.Args) != 3 {
				return true
			}
			calls++
			global, ok := call.Args[2].(*ast.Ident)
			require.True(t, ok && global.Name == "false", "%s: Qos's global argument must be a literal false (RabbitMQ 4.3 refuses global QoS)", fset.Position(call.Pos()))
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Positive(t, calls, "the consumer sets its prefetch with Qos")
}

// A quorum queue declared without TopologyConfig.DeliveryLimit has no
// limit on RabbitMQ 3.x and 4.0's default of 20 on 4.x: a consumer that
// returns a message (basic.nack with requeue, as Sluice's brake and its
// CLI's reads do) sees it 21 times, and on 4.x the 21st return
// dead-letters it into the poison queue (at-least-once, as the topology
// declares it); on 3.x it stays in the queue.
func TestQuorumQueueWithoutDeliveryLimitHasTheBrokersDefault(t *testing.T) {
	t.Parallel()
	const returns = 21
	topo := newTopology(t, rabbitmq.TopologyConfig{Quorum: true, TierDelays: []time.Duration{time.Minute}})
	conn := testenv.AMQP(t)
	require.NoError(t, newPublisher(t, "").Publish(topo.Config().Queue, msgs(1)...))
	ch := testenv.Channel(t, conn)
	for i := range returns {
		var d amqp.Delivery
		require.Eventually(t, func() bool {
			got, ok, err := ch.Get(topo.Config().Queue, false)
			require.NoError(t, err)
			d = got
			return ok
		}, time.Minute, 5*time.Millisecond, "delivery %d", i+1)
		require.NoError(t, d.Nack(false, true))
	}
	major := testenv.RabbitMQMajor(t)
	conn2 := testenv.AMQP(t)
	if major >= 4 {
		require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn2, topo.Config().PoisonQueue) == 1 }, time.Minute, 20*time.Millisecond,
			"RabbitMQ %s dead-letters the message after %d returns (default delivery limit 20)", testenv.RabbitMQVersion(t), returns)
		require.Zero(t, testenv.QueueDepth(t, conn2, topo.Config().Queue))
		return
	}
	require.Equal(t, 1, testenv.QueueDepth(t, conn2, topo.Config().Queue), "RabbitMQ 3.x has no default delivery limit")
	require.Zero(t, testenv.QueueDepth(t, conn2, topo.Config().PoisonQueue))
}
