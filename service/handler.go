package service

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// Handler is one reliable handler of the service: its stages are the
// production defaults (Stages says which), its inbox, outbox and replay
// outcomes the service's tables.
type Handler struct {
	// Name of the handler: the Watermill handler's, the inbox's consumer,
	// the metrics' consumer group. Required.
	Name string
	// Broker gives the handler its queue, subscriber, retry tiers and
	// poison queue (rabbitmq.NewBroker, embedded.New). Required.
	Broker broker.Broker
	// Key takes the business event id from a message
	// (sluice.KeyFromJSON("eventId"), say). Default the
	// sluice_event_id metadata (deduplication.Config.Key's default).
	Key sluice.KeyFunc
	// Handler handles a delivery inside the inbox's transaction
	// (sluicesql.TxFromContext). Exactly one of Handler and
	// PublishingHandler is required.
	Handler message.NoPublishHandlerFunc
	// PublishingHandler returns the messages it produces, to PublishTopic:
	// written in the inbox's transaction (the outbox) and published by the
	// service's relay after the commit — never lost to a failed publish,
	// never sent by a delivery that rolled back. Needs Config.Publisher.
	PublishingHandler message.HandlerFunc
	PublishTopic      string
	// BatchHandler handles the deliveries in flight in batches — one claim
	// statement, one call, one COMMIT per batch, each event's outcome its
	// own (deduplication.BatchHandler, router.HandlerConfig.BatchHandler):
	// for handlers that write a row or so per event (projections, ledgers,
	// audit trails), past what group commit gives (docs/batch-handlers.md).
	// What event i produces, it writes with the outbox on that event's
	// context: Stores().Outbox.Publish(msgs[i].Context(), topic, …). Not
	// with OrderBy; GroupCommit does not apply. Exactly one of Handler,
	// PublishingHandler and BatchHandler is required.
	BatchHandler *deduplication.BatchHandler
	// OrderBy keeps each key's messages in publish order through retries
	// (the ordering stage, docs/ordering.md): the key is the entity whose
	// events must apply in order (sluice.KeyFromMetadata("account")).
	// A key whose delivery went to a retry tier waits for it, its later
	// messages held in the service's database; the other keys flow. Needs
	// PostgreSQL and one consumer per queue. Default none: unordered.
	OrderBy sluice.KeyFunc
	// Consumers is how many copies of the handler consume the queue at
	// once. Default the broker's (router.HandlerConfig.Consumers).
	Consumers int
	// GroupCommit lets the deliveries in flight share one transaction (each
	// in its own savepoint, one COMMIT, every ack after it), with
	// deduplication.BatchConfig's defaults: for handlers whose work is short
	// next to a commit, with many deliveries in flight (docs/production.md).
	// Stages.Inbox.Batch, when set, wins. Default off.
	GroupCommit bool
	// Stages overrides the production defaults stage by stage: each stage
	// set here replaces the service's for this handler (the inbox's Store
	// and Key, the replay stage's Store, filled in when left unset), and
	// the shared settings (Stages.Env: MeterProvider, Signer, …) set here
	// win over Config.Env's, field by field. Unset, each stage is the
	// service's default (Defaults).
	Stages router.Stages
	// Without leaves stages out, by name (router.Order: "Trace", "Replay",
	// "Poison", "Retry", "Brake", "Classify", "Inbox", "Recoverer",
	// "ShutdownGrace"). What cannot keep the promise without them is
	// refused (router.ErrUnsafeStages: Retry without Poison; a
	// PublishingHandler without the Inbox).
	Without []string
}

// Defaults returns the stages the service gives every handler: trace,
// replay outcomes recorded in the inbox's transaction, poison, the retry
// tiers of the broker, a brake on unreachable dependencies (its probe the
// inbox's ping), the classifier, the inbox (on the service's table) and the
// recoverer, with ShutdownGrace's default.
func (s *Service) Defaults() router.Stages {
	return router.Stages{
		Trace:     &stage.TraceConfig{},
		Replay:    &replay.Config{Store: s.stores.Outcomes, InUnitOfWork: true},
		Poison:    &poison.Config{},
		Retry:     &retrytiers.Config{},
		Brake:     &brake.Config{Match: brake.MatchUnreachable},
		Classify:  &stage.ClassifyConfig{},
		Inbox:     &deduplication.Config{Store: s.stores.Inbox},
		Recoverer: &stage.RecovererConfig{},
	}
}

// stages returns h's stages: the defaults, h's overrides, Without applied.
func (s *Service) stages(h Handler) (router.Stages, error) {
	st := s.Defaults()
	o := h.Stages
	st.ShutdownGrace = o.ShutdownGrace
	st.Trace = cmp.Or(o.Trace, st.Trace)
	st.Poison = cmp.Or(o.Poison, st.Poison)
	st.Retry = cmp.Or(o.Retry, st.Retry)
	st.Brake = cmp.Or(o.Brake, st.Brake)
	st.Classify = cmp.Or(o.Classify, st.Classify)
	st.Recoverer = cmp.Or(o.Recoverer, st.Recoverer)
	if o.Replay != nil {
		r := *o.Replay
		r.Store = cmp.Or[replay.Store](r.Store, st.Replay.Store)
		st.Replay = &r
	}
	in := *st.Inbox
	if o.Inbox != nil {
		in = *o.Inbox
		in.Store = cmp.Or[deduplication.Store](in.Store, s.stores.Inbox)
	}
	if in.Key == nil {
		in.Key = h.Key
	}
	if in.Batch == nil && h.GroupCommit {
		in.Batch = &deduplication.BatchConfig{}
	}
	st.Inbox = &in
	if o.Order != nil || h.OrderBy != nil {
		var oc ordering.Config
		if o.Order != nil {
			oc = *o.Order
		}
		if oc.Key == nil {
			oc.Key = h.OrderBy
		}
		if oc.Store == nil {
			if s.stores.Order == nil {
				return st, fmt.Errorf("service: handler %q is ordered (Handler.OrderBy): the ordering store needs PostgreSQL, and the service's database is %s", h.Name, s.stores.DB().DriverName())
			}
			oc.Store = s.stores.Order
		}
		st.Order = &oc
	}
	st.Env = inherit.Env(o.Env, s.cfg.Env)
	for _, name := range h.Without {
		if !slices.Contains(router.Order(), name) {
			return st, fmt.Errorf("service: Handler.Without: no stage %q (router.Order names them: %v)", name, router.Order())
		}
		switch name {
		case "ShutdownGrace":
			st.ShutdownGrace = -1
		case "Trace":
			st.Trace = nil
		case "Replay":
			st.Replay = nil
		case "Order":
			st.Order = nil
		case "Poison":
			st.Poison = nil
		case "Retry":
			st.Retry = nil
		case "Brake":
			st.Brake = nil
		case "Classify":
			st.Classify = nil
		case "Inbox":
			st.Inbox = nil
		case "Recoverer":
			st.Recoverer = nil
		}
	}
	if st.Replay != nil && st.Replay.InUnitOfWork && (st.Inbox == nil || st.Inbox.Store != s.stores.Inbox) {
		// Recording "processed" in the inbox's transaction needs the
		// service's inbox; elsewhere the stage records after it.
		r := *st.Replay
		r.InUnitOfWork = false
		st.Replay = &r
	}
	return st, nil
}

// checkRetention checks that the inbox keeps a record for as long as a
// copy of the delivery may come back: the retry ladder plus the replay
// window (sluicesql.PrunerConfig's rule, the pruner's own check).
func (s *Service) checkRetention(h Handler, st router.Stages) error {
	if st.Inbox == nil || st.Inbox.Store != s.stores.Inbox {
		return nil
	}
	tiers := h.Broker.Endpoints().Tiers
	if st.Retry != nil && st.Retry.Tiers != nil {
		tiers = st.Retry.Tiers
	}
	var delays []time.Duration
	for _, t := range tiers {
		delays = append(delays, t.Delay)
	}
	if _, err := sluicesql.NewPruner(sluicesql.PrunerConfig{Store: s.stores.Inbox, Retention: s.cfg.InboxRetention,
		RetryDelays: delays, ReplayWindow: s.cfg.ReplayWindow}); err != nil {
		return fmt.Errorf("service: Config.InboxRetention is too short for handler %q: %w", h.Name, err)
	}
	return nil
}

// validate checks what Add needs beyond router.Add's own checks.
func (s *Service) validate(h Handler) error {
	switch {
	case h.Name == "":
		return errors.New("service: Handler.Name is required")
	case h.Broker == nil:
		return fmt.Errorf("service: Handler.Broker is required (handler %q)", h.Name)
	case h.PublishingHandler != nil && s.relay == nil:
		return fmt.Errorf("service: handler %q has a PublishingHandler: Config.Publisher is required (the outbox's relay publishes what it produces with it)", h.Name)
	}
	return nil
}
