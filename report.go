package sluice

import (
	"context"
	"errors"
)

// Outcome is what became of a delivery.
type Outcome string

// The outcomes, as the stages record them and the Trace stage reports them
// (span attribute and metric attribute "sluice.outcome").
const (
	OutcomeProcessed Outcome = "processed" // the handler succeeded: committed and acked
	OutcomeDuplicate Outcome = "duplicate" // the inbox had the key: acked, handler not run
	OutcomeRejected  Outcome = "rejected"  // an expected business rejection: committed and acked
	OutcomeRetried   Outcome = "retried"   // a copy was parked in a retry tier: acked
	OutcomePoisoned  Outcome = "poisoned"  // isolated in the poison queue: acked
	OutcomeParked    Outcome = "parked"    // the poison queue refused its copy, which waits in a delay queue: acked
	OutcomeFailed    Outcome = "failed"    // an error reached the router: nacked
	OutcomeHeld      Outcome = "held"      // the brake gave it back unprocessed (ErrHeld): nacked, no attempt spent
	OutcomeRequeued  Outcome = "requeued"  // a shutdown gave it back unprocessed (ErrShutdown): nacked, no attempt spent
	OutcomeWaiting   Outcome = "waiting"   // held behind its key's head in a retry tier (package ordering): stored, then acked; it runs after the head
)

// Report is what the stages record about one delivery, for the Trace stage.
// The zero Outcome means no stage recorded one.
type Report struct {
	Outcome Outcome
	Class   Class  // the failure class, if any
	Tier    string // the retry tier a copy went to
	Attempt int    // with OutcomeRetried, the attempt number of the copy
	Reason  string // the bounded error summary, when poisoned; else a stage's note (ordering: a replay out of its key's order)
	Panic   bool   // the handler panicked
	Stack   string // with Panic, the goroutine's stack at the panic
}

type reportKey struct{}

// reportCtx is a context carrying a Report, in one allocation.
type reportCtx struct {
	context.Context
	r Report
}

func (c *reportCtx) Value(key any) any {
	if _, ok := key.(reportKey); ok {
		return &c.r
	}
	return c.Context.Value(key)
}

// WithReport returns ctx carrying a new Report, and the Report.
func WithReport(ctx context.Context) (context.Context, *Report) {
	c := &reportCtx{Context: ctx}
	return c, &c.r
}

// ReportFromContext returns the delivery's Report, or nil outside a Trace
// stage. Stages record into it with Record.
func ReportFromContext(ctx context.Context) *Report {
	r, _ := ctx.Value(reportKey{}).(*Report)
	return r
}

// Record applies fn to the delivery's Report, if there is one.
func Record(ctx context.Context, fn func(*Report)) {
	if r := ReportFromContext(ctx); r != nil {
		fn(r)
	}
}

// Settle records the delivery's fate once the stack around the handler
// returned err, and returns it: the one place that turns what the stages
// recorded and what reached the router into one outcome, read by the Trace
// stage (span and metrics), the replay stage (the outcome record) and the
// logs. A held delivery (ErrHeld) is OutcomeHeld, a shutdown's
// (ErrShutdown) OutcomeRequeued, any other error OutcomeFailed with its
// class; without an error, what a stage recorded stands (duplicate,
// rejected, retried, parked, poisoned), else OutcomeProcessed. Calling it
// again with the same err changes nothing.
func (r *Report) Settle(err error) Outcome {
	switch {
	case errors.Is(err, ErrHeld):
		r.Outcome = OutcomeHeld
	case errors.Is(err, ErrShutdown):
		r.Outcome = OutcomeRequeued
	case err != nil:
		r.Outcome, r.Class = OutcomeFailed, ClassOf(err)
	case r.Outcome == "":
		r.Outcome = OutcomeProcessed
	}
	return r.Outcome
}
