package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/stage"
)

// Stages selects the stages around a handler; a nil field leaves its stage
// out (ShutdownGrace, a duration, is on by default: a negative value leaves
// it out). Whatever is chosen runs in the one order (Order):
//
//	ShutdownGrace → Trace → Replay → Order → Poison → Retry → Brake → Classify → Inbox → Recoverer → handler
type Stages struct {
	// ShutdownGrace lets a handler in flight finish its commit for this long
	// after the router begins to close (stage.ShutdownGrace). Default
	// 10 s; negative leaves the stage out.
	ShutdownGrace time.Duration
	Trace         *stage.TraceConfig
	// Replay records what became of a message replayed from a poison
	// queue (package replay), for sluice dlq replay and report.
	Replay *replay.Config
	// Order keeps each key's messages in publish order through retries
	// (package ordering, docs/ordering.md): a key whose delivery went to a
	// retry tier or the poison queue waits for it, its later messages held
	// in the inbox's database, while every other key flows. It needs Inbox
	// (its Consumer and EventID default to the handler's name and the
	// Inbox's Key) and one consumer per queue; Add serializes each key's
	// deliveries on the subscriber and runs the stage's resumer beside the
	// handler.
	Order  *ordering.Config
	Poison *poison.Config
	Retry  *retrytiers.Config
	// Brake stops consuming while Transient failures (of the kind its Match
	// accepts) dominate, holding deliveries back unprocessed instead of
	// spending their retry tiers (package brake). Add builds one brake per
	// handler, shared by its consumers, and gives it to a subscriber that
	// can stop consuming (GatedSubscriber), and closes it when that
	// subscriber closes. Its Probe defaults to the inbox store's Ping when
	// the store has one (a Ping(ctx) error method). Middlewares alone builds a brake per call that
	// waits instead (Pausing false unless set) and that nothing closes; for
	// a subscriber of your own, build it with brake.New, wire both and
	// Close it.
	Brake     *brake.Config
	Classify  *stage.ClassifyConfig
	Inbox     *deduplication.Config
	Recoverer *stage.RecovererConfig
	// Env is given to every stage, whose own Env fields win, field by
	// field (internal/inherit): the Classifier to every stage that classifies
	// (Poison, Retry, Brake, Classify, Inbox), so "commit on Rejected" and
	// "ack on Rejected" always agree (default sluice.DefaultClassifier());
	// the Signer to the Replay, Poison and Retry stages — the key that
	// proves Sluice wrote a delivery's control headers (the attempt, the
	// poison diagnosis, the replay run), which `sluice dlq replay
	// --signing-key-file` signs with too. Copies are signed for, and
	// control headers believed on, one queue: the Poison stage's Queue,
	// which the Replay and Retry stages get when their own is empty (by
	// hand without it: the topic the handler subscribed to). Default none:
	// the stages believe the retry history and the parked mark only on a
	// copy back from the queue's own tier, and the replay run of any
	// delivery (docs/architecture.md, "Trust boundary"). The MeterProvider
	// and TracerProvider default to the global OpenTelemetry providers, the
	// Clock to sluice.SystemClock(); the Logger, to every stage that logs:
	// Add gives the router's, Middlewares alone none. PublishTimeout and
	// PublishBackoff reach the Poison and Retry stages, StoreTimeout the
	// Inbox, Order and Replay stages (default each stage's own bound).
	sluice.Env

	// brake is the handler's brake, built once by Add.
	brake *brake.Brake
	// orderer is the handler's ordering stage, built once by Add.
	orderer *ordering.Orderer
	// trace is the Trace stage, built once (traceStage).
	trace message.HandlerMiddleware
}

// Middlewares builds the chosen stages, outermost first, for
// message.Handler.AddMiddleware (or message.Router.AddMiddleware), in the
// one order Order names. A configuration error names the stage and the
// field.
func Middlewares(s Stages) ([]message.HandlerMiddleware, error) {
	if s.Classifier == nil {
		s.Classifier = sluice.DefaultClassifier()
	}
	var mws []message.HandlerMiddleware
	var errs []error
	for _, st := range order {
		built, err := st.build(&s)
		if err != nil {
			errs = append(errs, fmt.Errorf("router: %s stage: %w", st.doc, err))
			continue
		}
		for _, mw := range built {
			if mw != nil {
				mws = append(mws, mw)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return mws, nil
}

// orderEntry is one entry of the one order: its name in Order, its name in
// errors, and how it is built from Stages (nothing when it is left out).
type orderEntry struct {
	name, doc string
	build     func(s *Stages) ([]message.HandlerMiddleware, error)
}

// order is the stages outermost first: the one place the order is written.
// Order returns their names; the doc comments and docs that draw the flow
// are checked against it (TestTheStageOrderIsWrittenOnce).
var order = []orderEntry{
	{"ShutdownGrace", "shutdown grace", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.ShutdownGrace < 0 {
			return nil, nil
		}
		return one(stage.ShutdownGrace(s.ShutdownGrace))
	}},
	{"Trace", "trace", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Trace == nil {
			return nil, nil
		}
		return one(s.traceStage())
	}},
	{"Replay", "replay", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Replay == nil {
			return nil, nil
		}
		cfg := *s.Replay
		cfg.Env = inherit.Env(cfg.Env, s.Env)
		cfg.Queue = cmp.Or(cfg.Queue, s.queue())
		if cfg.Tiers == nil && s.Retry != nil {
			for _, t := range s.Retry.Tiers {
				cfg.Tiers = append(cfg.Tiers, t.Topics()...)
			}
		}
		return one(replay.New(cfg))
	}},
	{"Order", "order", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Order == nil {
			return nil, nil
		}
		if s.Inbox == nil {
			return nil, errors.New("Stages.Order needs Stages.Inbox: the held messages and the inbox's records share its database, and a released message must run once")
		}
		if s.orderer == nil {
			o, err := s.newOrderer("")
			if err != nil {
				return nil, err
			}
			s.orderer = o
		}
		return []message.HandlerMiddleware{s.orderer.Middleware}, nil
	}},
	{"Poison", "poison", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Poison == nil {
			return nil, nil
		}
		cfg := *s.Poison
		cfg.Env = inherit.Env(cfg.Env, s.Env)
		return one(poison.New(cfg))
	}},
	{"Retry", "retry", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Retry == nil {
			return nil, nil
		}
		cfg := *s.Retry
		cfg.Env = inherit.Env(cfg.Env, s.Env)
		cfg.Queue = cmp.Or(cfg.Queue, s.queue())
		return one(retrytiers.New(cfg))
	}},
	{"Brake", "brake", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.brake == nil && s.Brake != nil {
			b, err := s.newBrake("", false)
			if err != nil {
				return nil, err
			}
			s.brake = b
		}
		if s.brake == nil {
			return nil, nil
		}
		return []message.HandlerMiddleware{s.brake.Middleware}, nil
	}},
	{"Classify", "classify", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Classify == nil {
			return nil, nil
		}
		cfg := *s.Classify
		cfg.Env = inherit.Env(cfg.Env, s.Env)
		return one(stage.Classify(cfg))
	}},
	{"Inbox", "inbox", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Inbox == nil {
			return nil, nil
		}
		cfg := *s.Inbox
		cfg.Env = inherit.Env(cfg.Env, s.Env)
		inbox, err := deduplication.New(cfg)
		if s.orderer != nil { // a delivery without an ordering key is poison
			inbox = chain(s.orderer.Inner, inbox)
		}
		if err != nil || s.Replay == nil {
			return []message.HandlerMiddleware{inbox}, err
		}
		// The replay stage's inner half, when it records "processed" in the
		// inbox's unit of work: inside the inbox, outside the recoverer.
		inner, err := replay.InTx(*s.Replay)
		if err != nil {
			return nil, fmt.Errorf("the replay stage in the inbox's unit of work: %w", err)
		}
		return []message.HandlerMiddleware{inbox, inner}, nil
	}},
	{"Recoverer", "recoverer", func(s *Stages) ([]message.HandlerMiddleware, error) {
		if s.Recoverer == nil {
			return nil, nil
		}
		return one(stage.Recoverer(*s.Recoverer))
	}},
}

// Order returns the names of the stages (the fields of Stages), outermost
// first: the one order Middlewares and Add build them in, whichever are
// chosen.
func Order() []string {
	names := make([]string, len(order))
	for i, st := range order {
		names[i] = st.name
	}
	return names
}

// chain is outer around inner, as one middleware.
func chain(outer, inner message.HandlerMiddleware) message.HandlerMiddleware {
	if inner == nil {
		return nil
	}
	return func(h message.HandlerFunc) message.HandlerFunc { return outer(inner(h)) }
}

// traceStage builds the Trace stage once: the stage and the ordering
// stage's releases share it (its instruments, its attribute sets).
func (s *Stages) traceStage() (message.HandlerMiddleware, error) {
	if s.trace == nil {
		cfg := *s.Trace
		cfg.Env = inherit.Env(cfg.Env, s.Env)
		mw, err := stage.Trace(cfg)
		if err != nil {
			return nil, err
		}
		s.trace = mw
	}
	return s.trace, nil
}

// newOrderer builds the ordering stage of Stages.Order for the handler
// named name: its Consumer defaults to name, its Inbox to Stages.Inbox
// (its event ids the inbox's Key; a redelivery of an applied message a
// duplicate, not held).
func (s *Stages) newOrderer(name string) (*ordering.Orderer, error) {
	cfg := *s.Order
	cfg.Consumer = cmp.Or(cfg.Consumer, name)
	if s.Inbox != nil {
		cfg.Consumer = cmp.Or(cfg.Consumer, s.Inbox.Consumer)
		if cfg.Inbox == nil {
			inbox := *s.Inbox
			inbox.Env = inherit.Env(inbox.Env, s.Env)
			cfg.Inbox = &inbox
		}
	}
	cfg.Env = inherit.Env(cfg.Env, s.Env)
	if s.Trace != nil && cfg.Released == nil { // a released message's span and outcome, as a delivery's
		mw, err := s.traceStage()
		if err != nil {
			return nil, fmt.Errorf("router: order stage: %w", err)
		}
		cfg.Released = mw
	}
	o, err := ordering.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("router: order stage: %w", err)
	}
	return o, nil
}

func one(mw message.HandlerMiddleware, err error) ([]message.HandlerMiddleware, error) {
	if err != nil {
		return nil, err
	}
	return []message.HandlerMiddleware{mw}, nil
}

// queue is the consumer's queue the Replay and Retry stages sign for and
// believe control headers on when their own Queue is empty: the Poison
// stage's Queue — the one its copies name, and `sluice dlq replay` sends
// them back to — so the three agree ("" leaves each stage to the topic the
// handler subscribed to).
func (s *Stages) queue() string {
	if s.Poison == nil {
		return ""
	}
	return s.Poison.Queue
}

// pinger is a dependency that can say whether it answers without being
// given a message. An inbox Store that is one (a Ping(ctx) error method)
// becomes the brake's Probe when Stages.Brake has none.
type pinger interface {
	Ping(ctx context.Context) error
}

// newBrake builds the brake of Stages.Brake for the handler named name; its
// Classifier defaults to Stages.Env.Classifier, then to brake.New's default;
// its Probe to the inbox store's Ping.
func (s *Stages) newBrake(name string, pausing bool) (*brake.Brake, error) {
	cfg := *s.Brake
	cfg.Name = cmp.Or(cfg.Name, name)
	if p, ok := s.inboxStore().(pinger); ok && cfg.Probe == nil {
		cfg.Probe = p.Ping
	}
	cfg.Pausing = cfg.Pausing || pausing
	cfg.Env = inherit.Env(cfg.Env, s.Env)
	b, err := brake.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("router: brake stage: %w", err)
	}
	return b, nil
}

func (s Stages) inboxStore() deduplication.Store {
	if s.Inbox == nil {
		return nil
	}
	return s.Inbox.Store
}
