package service_test

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicesql"
)

// addLedger is the README's batch handler: a ledger that writes the
// deliveries in flight in one statement per batch. TestTheREADMEBatchHandlerRuns
// runs it.
func addLedger(ctx context.Context, svc *service.Service, amqpURL string) (*rabbitmq.Broker, error) {
	q, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: amqpURL},
		Topology:   rabbitmq.TopologyConfig{Queue: "ledger", Quorum: true, DeliveryLimit: 20},
		Prefetch:   128, // deliveries in flight: a batch of 64 gathers while the one before commits
	})
	if err != nil {
		return nil, err
	}
	err = svc.Add(service.Handler{
		Broker: q,
		Name:   "ledger",
		Key:    sluice.KeyFromJSON("eventId"),
		BatchHandler: &deduplication.BatchHandler{Handle: func(ctx context.Context, msgs []*message.Message) []error {
			entries := make([]json.RawMessage, len(msgs)) // each event once: duplicates were left out
			for i, m := range msgs {
				entries[i] = json.RawMessage(m.Payload)
			}
			rows, err := json.Marshal(entries)
			if err != nil {
				return deduplication.SameOutcome(msgs, err)
			}
			tx := sluicesql.TxFromContext(ctx) // the inbox's transaction: the batch's claims are in it
			_, err = tx.ExecContext(ctx, `INSERT INTO ledger (entry) SELECT value FROM jsonb_array_elements($1::jsonb)`, string(rows))
			return deduplication.SameOutcome(msgs, err) // one row's fault: found by halving the batch, the rest commit
		}},
	})
	if err != nil {
		return nil, errors.Join(err, q.Close())
	}
	return q, nil
}
