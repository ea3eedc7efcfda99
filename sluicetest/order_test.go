package sluicetest_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicetest"
)

// recorder is a testing.TB that keeps the kit's failures instead of
// failing the test, to show what a kit test reports.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) report() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.errors, "\n")
}

// recoversInTierOne is a kit test a team would write: a payment whose card
// service times out once is retried through the first tier and processed
// once.
func recoversInTierOne(t testing.TB, stages func(*service.Handler, **sluicetest.Harness)) {
	var h *sluicetest.Harness
	sh := service.Handler{PublishingHandler: handle(&h), PublishTopic: "receipts"}
	stages(&sh, &h)
	h = sluicetest.New(t, sluicetest.Config{Handler: sh, Setup: setup})
	h.Publish("slow card", pay("evt-1", payment{Fail: "transient", Attempts: 1}))
	h.Settle()
	h.RequireProcessedOnce("slow card")
	h.RequireOutcomes("slow card", "retried to tier 1", "processed, produced receipt:evt-1")
}

// Breaking the stage order — the retry tiers inside the inbox, as a
// hand-wired stack could put them — makes the kit test fail, and its
// message says why: the inbox committed the claim of the delivery the
// retry stage parked, so the copy back from the tier was a duplicate and
// the payment was never processed. In the one order it passes.
func TestBreakingTheStageOrderFailsAKitTest(t *testing.T) {
	t.Parallel()
	recoversInTierOne(t, func(*service.Handler, **sluicetest.Harness) {})

	r := &recorder{TB: t}
	recoversInTierOne(r, func(sh *service.Handler, h **sluicetest.Harness) {
		sh.Without = []string{"Retry", "Poison"} // moved inside the inbox, below
		inner := sh.PublishingHandler
		var once sync.Once
		var retry message.HandlerFunc
		sh.PublishingHandler = func(msg *message.Message) ([]*message.Message, error) {
			once.Do(func() {
				e := (*h).Broker().Endpoints()
				mw, err := retrytiers.New(retrytiers.Config{Tiers: e.Tiers, Publisher: e.RetryPublisher})
				require.NoError(t, err)
				retry = mw(inner)
			})
			return retry(msg)
		}
	})
	report := r.report()
	require.Contains(t, report, `sluicetest: "slow card" was processed 0 times, want once`)
	require.Contains(t, report, `trace: retried to tier 1 @0s → duplicate @30s`)
	t.Logf("what the kit reported with the retry tiers inside the inbox:\n%s", report)
}

// A failure names the subject, says what was expected and what happened,
// and writes the whole trace with its virtual times.
func TestAFailureMessageWritesTheTrace(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	var h *sluicetest.Harness
	h = sluicetest.New(r, sluicetest.Config{Handler: service.Handler{PublishingHandler: handle(&h), PublishTopic: "receipts"}, Setup: setup})
	h.Publish("malformed", sluicetest.Message("evt-1", []byte(`{`)))
	h.Settle()
	require.False(t, h.RequireProcessedOnce("malformed"))
	require.False(t, h.RequirePoisoned("malformed", sluice.ClassExhausted, nil))
	require.False(t, h.RequirePoisoned("malformed", sluice.ClassPoison, map[string]string{"sluice_poison_reason": "something else"}))
	require.False(t, h.RequireOutcomes("malformed", "processed"))
	require.False(t, h.RequireParked("malformed", 2))
	require.True(t, h.RequirePoisoned("malformed", sluice.ClassPoison, map[string]string{"sluice_poison_class": "poison"}))
	report := r.report()
	for _, want := range []string{
		`sluicetest: "malformed" was processed 0 times, want once` + "\n\ttrace: poisoned (poison) @0s",
		`"malformed" was poisoned with class poison, want exhausted`,
		`"malformed" was poisoned with sluice_poison_reason="poison: unexpected end of JSON input", want "something else"`,
		`"malformed" went through` + "\n\t\t\"poisoned (poison)\"\n\twant\n\t\t\"processed\"",
		`"malformed" never went to retry tier 2`,
	} {
		require.Contains(t, report, want)
	}
}
