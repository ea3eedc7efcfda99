package main

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/sluicesql"
)

// orderLog records every order.created event once, a row each, in the
// order_log table: an audit trail. It reads nothing and decides nothing,
// and the rows need no per-key order — the work a batch handler fits
// (docs/batch-handlers.md): the deliveries in flight are claimed in one
// statement, written in one multi-row INSERT and committed together. The
// table has no unique constraint: the inbox alone keeps each event once.
type orderLog struct {
	tables tables
}

// record writes a batch's events — each once: the inbox left out the keys
// committed before and the copies of one key within the batch — in one
// statement, inside the inbox's transaction.
func (l *orderLog) record(ctx context.Context, msgs []*message.Message) []error {
	outcomes := make([]error, len(msgs))
	failed := false
	rows := make([]string, 0, len(msgs))
	args := make([]any, 0, 4*len(msgs))
	for i, m := range msgs {
		var o orderCreated
		if err := json.Unmarshal(m.Payload, &o); err != nil {
			outcomes[i], failed = err, true // Poison: this event leaves the batch, isolated alone
			continue
		}
		rows = append(rows, "(?, ?, ?, ?)")
		args = append(args, o.EventID, o.OrderID, o.SKU, o.Qty)
	}
	if failed { // the batch is rolled back and runs again without them: nothing to write in this run
		return outcomes
	}
	tx := sluicesql.TxFromContext(ctx) // the inbox's transaction: the batch's claims are in it
	// A multi-row VALUES list: one statement on SQLite and PostgreSQL alike
	// (MaxBatch 64 × 4 parameters, far below either's limit).
	_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO `+l.tables.of("order_log")+` (event_id, order_id, sku, qty) VALUES `+strings.Join(rows, ", ")), args...)
	return deduplication.SameOutcome(msgs, err) // a row's fault is found by halving the batch; the others commit
}
