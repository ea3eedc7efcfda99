package sluice

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Env is the environment the stages share: where they log, meter and trace,
// the clock they take their time from, the classifier they agree on, the
// key that signs their control headers, and how long a publish or a store
// call may take. Every stage config embeds it (a
// stage reads the fields it uses); router.Stages and service.Config take it
// once and give it to each stage, whose own non-zero fields win, field by
// field (a Signer holding a nil pointer counts as none). The zero Env is
// each stage's defaults: no logger (watermill.NopLogger; router.Add and
// service give the router's), the global OpenTelemetry providers,
// SystemClock, DefaultClassifier, no key, and each stage's own bounds.
type Env struct {
	// Logger receives what a stage logs: each fate decided, a store's or
	// the relay's errors. Default none (router.Add and service.New give the
	// router's logger).
	Logger watermill.LoggerAdapter
	// MeterProvider receives the stages' metrics: give promexport.New's to
	// serve them to Prometheus. Default the global OpenTelemetry provider.
	MeterProvider metric.MeterProvider
	// TracerProvider receives the Trace stage's, the brake's and the batch
	// handler's spans. Default the global OpenTelemetry provider.
	TracerProvider trace.TracerProvider
	// Clock is where the stages take their time from (the brake's
	// cool-down, the times the retry and poison stages stamp). Default
	// SystemClock.
	Clock Clock
	// Classifier classifies failures for every stage that does (Poison,
	// Retry, Classify, Inbox, Brake), so that "commit on Rejected" and
	// "ack on Rejected" agree. Default DefaultClassifier().
	Classifier *Classifier
	// Signer is the key that proves Sluice wrote a delivery's control
	// headers (the attempt, the poison diagnosis, the replay run): a
	// *signing.Signer. Default none (nil, or a nil *signing.Signer): the
	// stages believe the retry history and the parked mark only on a copy
	// back from the queue's own tier, and the replay run of any delivery
	// (docs/architecture.md, "Trust boundary").
	Signer Signer
	// PublishTimeout bounds a publish, on a context detached from the
	// handler's: one copy of the retry and poison stages (to a tier, the
	// poison queue, the park topic), one batch of the outbox relay's. A
	// publish that has not returned by then failed (uncertain: the copy may
	// be stored). Default 30 s.
	PublishTimeout time.Duration
	// PublishBackoff is waited by the retry and poison stages before they
	// return a failed publish of a copy, so that an unreachable tier or
	// poison queue is not a hot redelivery loop. Default 1 s.
	PublishBackoff time.Duration
	// StoreTimeout bounds each call a stage makes to its store: the inbox's
	// (Begin, Claim, Commit, Rollback), the ordering stage's, the outbox
	// relay's, the replay stage's record. Default 10 s (the replay stage's
	// record: 5 s); negative: the inbox's calls are bounded by the message
	// context alone (the other stages refuse it). Each stage's Env says what
	// a call that outlives it becomes.
	StoreTimeout time.Duration
}

// Signer signs the control headers of the copies a stage sends and says
// which of a delivery's it may believe: *signing.Signer is the one (its nil
// value, no key, included).
type Signer interface {
	// Sign sets msg's SignatureKey for queue, the consumer's queue the
	// copy belongs to (a nil key removes it).
	Sign(msg *message.Message, queue string)
	// Believe removes from msg the control headers owned names unless
	// Sluice wrote them for queue (or, without a key, the copy came back
	// from one of tiers), and returns the keys removed.
	Believe(msg *message.Message, owned func(string) bool, queue string, tiers ...string) []string
}
