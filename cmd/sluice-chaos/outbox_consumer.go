package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// receiverName is the handler that consumes what the effects handler
// produces through the outbox.
const receiverName = "receiver"

// producedID is the event id of the message the effects handler produces
// for the event eventID.
func producedID(eventID string) string { return "out:" + eventID }

// outboxProcess is what a consumer process adds in the outbox scenario:
// its effects handler produces one message per event through the outbox,
// a relay publishes the outbox, and a receiver with its own inbox writes
// one row per produced event id.
type outboxProcess struct {
	db       *sqlx.DB
	schema   string
	queue    string // where the effects handler produces
	crash    func(string)
	inbox    func(deduplication.Store, string, sluice.KeyFunc) *deduplication.Config // the receiver's
	store    *sluicesql.Outbox
	receiver *rabbitmq.Broker
	relay    *outbox.Relay
	relayed  chan error
}

// start turns cfg's handler into a PublishingHandler producing through the
// outbox, adds the receiver to r, and starts a relay on pub until ctx ends.
func (p *outboxProcess) start(ctx context.Context, r *message.Router, cfg *router.HandlerConfig, receiver rabbitmq.BrokerConfig, pub *rabbitmq.Publisher) error {
	var err error
	p.store, err = sluicesql.NewOutbox(p.db, sluicesql.OutboxConfig{Table: p.schema + ".outbox"})
	if err != nil {
		return err
	}
	handle := cfg.Handler
	cfg.Handler, cfg.PublishTopic, cfg.Outbox = nil, p.queue, p.store
	cfg.PublishingHandler = func(msg *message.Message) ([]*message.Message, error) {
		if err := handle(msg); err != nil {
			return nil, err
		}
		var e event
		if err := json.Unmarshal(msg.Payload, &e); err != nil {
			return nil, err
		}
		id := producedID(e.EventID)
		out := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"eventId":%q}`, id)))
		out.Metadata.Set(sluice.EventIDKey, id)
		return []*message.Message{out}, nil
	}

	receiver.Topology.Queue = p.queue
	if p.receiver, err = dialBroker(ctx, receiver); err != nil {
		return err
	}
	inbox, err := sluicesql.NewInbox(p.db, sluicesql.InboxConfig{Table: p.schema + ".receiver_inbox"})
	if err != nil {
		return err
	}
	insert := `INSERT INTO ` + p.schema + `.received (event_id) VALUES ($1)`
	r.AddMiddleware(countDuplicates)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: p.receiver,
		Name:   receiverName, Consumers: cfg.Consumers,
		Handler: func(msg *message.Message) error {
			tx := sluicesql.TxFromContext(msg.Context())
			if _, err := tx.ExecContext(msg.Context(), insert, msg.Metadata.Get(sluice.EventIDKey)); err != nil {
				return err
			}
			p.crash("receiver-before-commit")
			return nil
		},
		Stages: router.Stages{
			Poison:    &poison.Config{Env: sluice.Env{PublishBackoff: 200 * time.Millisecond}},
			Retry:     &retrytiers.Config{Env: sluice.Env{PublishBackoff: 200 * time.Millisecond}},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     p.inbox(inbox, receiverName, nil),
			Recoverer: &stage.RecovererConfig{},
		},
	})
	if err != nil {
		return err
	}
	p.relay, err = outbox.NewRelay(p.store, crashingRelayPublisher{pub, p.crash}, outbox.RelayConfig{})
	if err != nil {
		return err
	}
	p.relayed = make(chan error, 1)
	go func() { p.relayed <- p.relay.Run(ctx) }()
	return nil
}

// close stops the relay, finishing its batch, and closes the receiver's
// broker: after the router returned. A nil p has nothing to close.
func (p *outboxProcess) close() error {
	if p == nil {
		return nil
	}
	var errs []error
	if p.relay != nil {
		errs = append(errs, p.relay.Close(), <-p.relayed)
	}
	if p.receiver != nil {
		errs = append(errs, p.receiver.Close())
	}
	return errors.Join(errs...)
}

// dialBroker connects a broker, waiting while RabbitMQ is restarting.
func dialBroker(ctx context.Context, cfg rabbitmq.BrokerConfig) (*rabbitmq.Broker, error) {
	for {
		b, err := rabbitmq.NewBroker(ctx, cfg)
		if err == nil {
			return b, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// crashPoint names the after-commit crash point of msg's handler.
func crashPoint(msg *message.Message) string {
	if strings.HasPrefix(message.HandlerNameFromCtx(msg.Context()), receiverName) {
		return "receiver-after-commit"
	}
	return "after-commit"
}

// countDuplicates reports each receiver delivery the inbox skipped as a
// duplicate (its event id was done) as "count duplicate 1".
func countDuplicates(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if !strings.HasPrefix(message.HandlerNameFromCtx(msg.Context()), receiverName) {
			return h(msg)
		}
		ctx := msg.Context()
		rctx, report := sluice.WithReport(ctx)
		msg.SetContext(rctx)
		out, err := h(msg)
		msg.SetContext(ctx)
		if err == nil && report.Outcome == sluice.OutcomeDuplicate {
			fmt.Fprintln(os.Stderr, "count duplicate 1")
		}
		return out, err
	}
}

// crashingRelayPublisher is the relay's publisher: it reports how many
// messages the broker confirmed ("count relayed N"), and crashes in the
// middle of a batch (half of it confirmed, the rest not sent) and after a
// batch's publishes, before the relay deletes its rows.
type crashingRelayPublisher struct {
	*rabbitmq.Publisher
	crash func(string)
}

var _ broker.EachPublisher = crashingRelayPublisher{}

func (p crashingRelayPublisher) PublishEach(topic string, msgs ...*message.Message) []error {
	half := len(msgs) / 2
	errs := p.publish(topic, msgs[:half])
	if half > 0 {
		p.crash("relay-mid-batch")
	}
	errs = append(errs, p.publish(topic, msgs[half:])...)
	p.crash("relay-after-publish")
	return errs
}

func (p crashingRelayPublisher) publish(topic string, msgs []*message.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	errs := p.Publisher.PublishEach(topic, msgs...)
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		}
	}
	if n > 0 {
		fmt.Fprintln(os.Stderr, "count relayed", n)
	}
	return errs
}
