package router_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// effects counts each event's effect, done outside any transaction (the
// MemoryStore and Redis join none).
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func newEffects() *effects { return &effects{n: map[string]int{}} }

func (e *effects) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n[id]++
}

func (e *effects) distinct() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.n)
}

// runBatchRouter starts a router with one batch handler on queue (prefetch 8:
// a batch closes once the 8 deliveries in flight are in it).
func runBatchRouter(t *testing.T, queue string, store deduplication.Store, env sluice.Env, handle func(context.Context, []*message.Message) []error) (*message.Router, <-chan error, func()) {
	t.Helper()
	q := projectionBroker(t, queue, 8)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "projection",
		BatchHandler: &deduplication.BatchHandler{Handle: handle, MaxWait: time.Second},
		Stages: router.Stages{Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Inbox: &deduplication.Config{Store: store}, Env: env},
	})
	require.NoError(t, err)
	for i := range 8 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		id := "evt-" + string(rune('a'+i))
		if i == 3 {
			id = "evt-bad"
		}
		m.Metadata.Set(sluice.EventIDKey, id)
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	done := testenv.RunRouter(context.Background(), r)
	return r, done, func() { require.NoError(t, q.Close()) }
}

// A batch handler that sorts its batch in place (for one order of row
// locks in its multi-row write, say) and returns outcomes[i] for msgs[i] as
// it left them, on RabbitMQ and PostgreSQL (its rows in the inbox's
// transaction): 8 events, one of them ("evt-bad") Poison. Only evt-bad
// goes to the poison queue, and every other event's row exists once.
// Before, the outcomes were read in the batch's own order, not the order of
// the slice the handler returned them for: a good event was failed with
// evt-bad's error and left the batch, which ran again and failed the next
// one — good events poisoned, their rows never written.
func TestABatchHandlerThatSortsItsBatchKeepsEachOutcomeWithItsEvent(t *testing.T) {
	t.Parallel()
	queue := projectionQueue(t, "projection_sorted")
	db, schema, store := inbox(t)
	handle := func(ctx context.Context, msgs []*message.Message) []error {
		sort.Slice(msgs, func(i, j int) bool {
			return msgs[i].Metadata.Get(sluice.EventIDKey) > msgs[j].Metadata.Get(sluice.EventIDKey)
		})
		out := make([]error, len(msgs))
		tx := sluicesql.TxFromContext(ctx)
		for i, m := range msgs {
			id := m.Metadata.Get(sluice.EventIDKey)
			if id == "evt-bad" {
				out[i] = sluice.Poison(errors.New("unknown product"))
				continue
			}
			if _, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), id); err != nil {
				out[i] = err
			}
		}
		return out
	}
	r, runDone, closeBroker := runBatchRouter(t, queue, store, sluice.Env{}, handle)
	conn := testenv.AMQP(t)
	settled(t, conn, queue, 8, func() int { return reservations(t, db, schema) + testenv.QueueDepth(t, conn, queue+".poison") })
	require.NoError(t, r.Close())
	require.NoError(t, <-runDone)
	closeBroker()
	poisoned := testenv.Drain(t, conn, queue+".poison")
	var ids []string
	for _, d := range poisoned {
		ids = append(ids, d.Headers[sluice.EventIDKey].(string))
	}
	require.Equal(t, []string{"evt-bad"}, ids, "only the event that failed is poisoned")
	var rows []string
	require.NoError(t, db.Select(&rows, fmt.Sprintf(`SELECT event_key FROM %s.reservations ORDER BY event_key`, schema)))
	require.Equal(t, []string{"evt-a", "evt-b", "evt-c", "evt-e", "evt-f", "evt-g", "evt-h"}, rows, "each good event's row once")
}

// fieldErrors is a validation error as validator.ValidationErrors is: a
// slice type implementing error by value — not comparable.
type fieldErrors []string

func (f fieldErrors) Error() string { return "invalid fields: " + strings.Join(f, ", ") }

// A batch handler whose outcome for events of a batch is a validation
// error of a slice type (validator.ValidationErrors' shape), which the
// handler's Classifier classes Poison (sluice.RuleAs), on RabbitMQ and the
// MemoryStore: 8 events, 7 of them invalid: those go to the poison queue,
// the eighth is done.
//
// Before, the batch handler compared the outcomes with != to tell "one
// error for the whole batch": two interface values of an uncomparable
// dynamic type panic ("comparing uncomparable type"), in the batch's
// goroutine, outside any recover — the process crashed, every delivery in
// flight with it.
func TestABatchHandlersOutcomesOfAnUncomparableTypeDoNotCrashTheProcess(t *testing.T) {
	t.Parallel()
	queue := projectionQueue(t, "projection_uncomparable")
	classifier, err := sluice.NewClassifier(sluice.ClassifierConfig{Rules: []sluice.Rule{sluice.RuleAs[fieldErrors](sluice.ClassPoison)}})
	require.NoError(t, err)
	done := newEffects()
	handle := func(_ context.Context, msgs []*message.Message) []error {
		out := make([]error, len(msgs))
		for i, m := range msgs {
			id := m.Metadata.Get(sluice.EventIDKey)
			if id != "evt-h" {
				out[i] = fieldErrors{"quantity of " + id}
				continue
			}
			done.add(id)
		}
		return out
	}
	r, runDone, closeBroker := runBatchRouter(t, queue, deduplication.NewMemoryStore(), sluice.Env{Classifier: classifier}, handle)
	conn := testenv.AMQP(t)
	settled(t, conn, queue, 8, func() int { return done.distinct() + testenv.QueueDepth(t, conn, queue+".poison") })
	require.NoError(t, r.Close())
	require.NoError(t, <-runDone)
	closeBroker()
	require.Equal(t, 7, testenv.QueueDepth(t, conn, queue+".poison"))
	require.Equal(t, 1, done.distinct())
}

// settled waits until count reaches want (or passes it) and the queue and
// its tier are empty; the caller then closes the router, which waits for
// what is in flight.
func settled(t *testing.T, conn *amqp.Connection, queue string, want int, count func() int) {
	t.Helper()
	require.NoError(t, testenv.AwaitCount(want, time.Minute, 10*time.Minute, func() int {
		if testenv.QueueDepth(t, conn, queue)+testenv.QueueDepth(t, conn, queue+".retry.100ms") > 0 {
			return 0
		}
		return count()
	}))
}
