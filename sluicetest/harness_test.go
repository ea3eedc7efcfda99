package sluicetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicetest"
)

// payment is the handler of these tests: it writes a row in the inbox's
// transaction, fails as its payload says, and produces a receipt.
type payment struct {
	Fail     string `json:"fail"` // "", "transient", "reject", "panic", "invariant", "block"
	Attempts int    `json:"attempts"`
}

func setup(ctx context.Context, db *sqlx.DB) error {
	_, err := db.ExecContext(ctx, `CREATE TABLE payments (event_id TEXT NOT NULL)`)
	return err
}

// blocked receives the context of each delivery of a payment that blocks:
// it waits until that context ends.
var blocked = make(chan context.Context, 1)

func handle(h **sluicetest.Harness) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var p payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return nil, err
		}
		if err := (*h).Dependency(msg.Context()); err != nil {
			return nil, err
		}
		attempt, _ := sluice.Attempt(msg)
		switch p.Fail {
		case "transient":
			if attempt <= p.Attempts {
				return nil, fmt.Errorf("card service: %w", context.DeadlineExceeded)
			}
		case "reject":
			return nil, sluice.Reject(errors.New("card declined"))
		case "panic":
			panic("nil map")
		case "invariant":
			return nil, sluice.Invariant(errors.New("the account must exist"))
		case "block":
			blocked <- msg.Context()
			<-msg.Context().Done()
			return nil, fmt.Errorf("card service: %w", context.Cause(msg.Context()))
		}
		tx := sluicesql.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), tx.Rebind(`INSERT INTO payments (event_id) VALUES (?)`), msg.Metadata.Get(sluice.EventIDKey)); err != nil {
			return nil, err
		}
		receipt := sluicetest.Message("receipt:"+msg.Metadata.Get(sluice.EventIDKey), []byte(`{}`))
		return []*message.Message{receipt}, nil
	}
}

func newHarness(t *testing.T, cfg sluicetest.Config) *sluicetest.Harness {
	var h *sluicetest.Harness
	cfg.Handler.PublishingHandler = handle(&h)
	cfg.Handler.PublishTopic = "receipts"
	cfg.Setup = setup
	h = sluicetest.New(t, cfg)
	return h
}

func pay(id string, p payment) *message.Message {
	b, _ := json.Marshal(p)
	return sluicetest.Message(id, b)
}

func payments(t *testing.T, h *sluicetest.Harness) int {
	var n int
	require.NoError(t, h.DB().Get(&n, `SELECT count(*) FROM payments`))
	return n
}

// The default ladder, 30s → 5m → 30m, runs on the virtual clock: a payment
// whose card service times out three times goes through the three tiers
// and is processed at 35m30s of virtual time; one that never recovers is
// poisoned Exhausted.
func TestTheDefaultLadderRunsOnTheVirtualClock(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	start := time.Now()
	h.Publish("recovers", pay("evt-1", payment{Fail: "transient", Attempts: 3}))
	h.Publish("never", pay("evt-2", payment{Fail: "transient", Attempts: 99}))
	h.Advance(29 * time.Second)
	h.RequireOutcomes("recovers", "retried to tier 1")
	h.Advance(time.Second)
	h.RequireOutcomes("recovers", "retried to tier 1", "retried to tier 2")
	h.Settle()
	h.RequireOutcomes("recovers", "retried to tier 1", "retried to tier 2", "retried to tier 3", "processed, produced receipt:evt-1")
	h.RequireProcessedOnce("recovers")
	h.RequireProduced("recovers", "receipt:evt-1")
	h.RequirePoisoned("never", sluice.ClassExhausted, map[string]string{"sluice_poison_class": "exhausted"})
	require.Equal(t, 35*time.Minute+30*time.Second, h.Trace("recovers").Last().At)
	require.Equal(t, 1, payments(t, h))
	t.Logf("35m30s of virtual time in %s", time.Since(start))
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.Publish("new", pay("evt-1", payment{}))
	h.Publish("rejected", pay("evt-2", payment{Fail: "reject"}))
	h.Publish("panics", pay("evt-3", payment{Fail: "panic"}))
	h.Publish("invariant", pay("evt-4", payment{Fail: "invariant"}))
	h.Publish("malformed", sluicetest.Message("evt-5", []byte(`{"fail":`)))
	h.Settle()
	h.Redeliver("new", "new again")
	h.Settle()
	h.RequireProcessedOnce("new")
	h.RequireDuplicate("new again")
	h.RequireRejected("rejected")
	h.RequirePoisoned("panics", sluice.ClassInvariant, map[string]string{"sluice_poison_stack": ""})
	h.RequirePoisoned("invariant", sluice.ClassInvariant, map[string]string{"sluice_poison_reason": "invariant: the account must exist"})
	h.RequirePoisoned("malformed", sluice.ClassPoison, nil)
	require.Equal(t, 1, payments(t, h))
}

// The kit's SQLite inbox records processed_at on the virtual clock: a
// payment processed after its two tiers is recorded 5m30s after the
// harness started.
func TestTheInboxRecordsVirtualTime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{})
	h.Publish("slow", pay("evt-1", payment{Fail: "transient", Attempts: 2}))
	h.Settle()
	var at int64
	require.NoError(t, h.DB().Get(&at, `SELECT processed_at FROM sluice_inbox WHERE event_key = 'evt-1'`))
	require.Equal(t, sluicetest.Epoch.Add(5*time.Minute+30*time.Second), time.UnixMicro(at).UTC())
}

// The kit runs on your PostgreSQL too (Config.DB): the virtual ladder, the
// real inbox and outbox tables.
func TestTheKitOnPostgreSQL(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sluicetest.Config{DB: testenv.PostgresInSchema(t)})
	h.Publish("slow", pay("evt-1", payment{Fail: "transient", Attempts: 3}))
	h.Publish("rejected", pay("evt-2", payment{Fail: "reject"}))
	h.Settle()
	h.Redeliver("slow", "slow again")
	h.Settle()
	h.RequireOutcomes("slow", "retried to tier 1", "retried to tier 2", "retried to tier 3", "processed, produced receipt:evt-1")
	h.RequireDuplicate("slow again")
	h.RequireRejected("rejected")
	h.RequireProduced("slow", "receipt:evt-1")
	require.Equal(t, 1, payments(t, h))
}

// A batch handler runs in the kit as in a service: each event's outcome its
// own — done, a duplicate, retried through a tier on the virtual clock
// (the batch ran again without it), poisoned with its reason.
func TestTheKitRunsABatchHandler(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, sluicetest.Config{Handler: service.Handler{
		BatchHandler: &deduplication.BatchHandler{Handle: func(ctx context.Context, msgs []*message.Message) []error {
			out := make([]error, len(msgs))
			for i, m := range msgs {
				switch string(m.Payload) {
				case "flaky":
					if n, _ := sluice.Attempt(m); n <= 1 {
						out[i] = fmt.Errorf("card service: %w", context.DeadlineExceeded)
					}
				case "bad":
					out[i] = sluice.Poison(errors.New("unknown product"))
				}
			}
			return out
		}},
	}})
	h.Publish("ok", sluicetest.Message("evt-1", []byte("ok")))
	h.Publish("again", sluicetest.Message("evt-1", []byte("ok")))
	h.Publish("flaky", sluicetest.Message("evt-2", []byte("flaky")))
	h.Publish("bad", sluicetest.Message("evt-3", []byte("bad")))
	h.Settle()
	// The two copies of evt-1 arrive together: either may be the one the
	// batch handler sees.
	both := append(h.Trace("ok").Outcomes(), h.Trace("again").Outcomes()...)
	require.ElementsMatch(t, []string{"processed", "duplicate"}, both)
	h.RequireOutcomes("flaky", "retried to tier 1", "processed")
	h.RequirePoisoned("bad", sluice.ClassPoison, map[string]string{"sluice_poison_reason": "poison: unknown product"})
}
