package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/sluicesql"
)

const rejectedTopic = "inventory.reservation-rejected"

var errOutOfStock = errors.New("out of stock")

// inventory reserves stock for order.created events. Every write goes into
// the inbox transaction; so does the rejection event it returns, which the
// service writes into the outbox table for its relay.
type inventory struct {
	tables tables
}

// tables qualifies table names (a PostgreSQL schema, or none on SQLite).
// Its schema is both handlers' tables: the inventory's and the order log's.
type tables string

func (t tables) of(name string) string {
	if t == "" {
		return name
	}
	return string(t) + "." + name
}

func (t tables) schema() []string {
	return []string{
		`CREATE TABLE ` + t.of("orders") + ` (order_id TEXT PRIMARY KEY)`,
		`CREATE TABLE ` + t.of("stock") + ` (sku TEXT PRIMARY KEY, available INTEGER NOT NULL)`,
		`CREATE TABLE ` + t.of("reservations") + ` (order_id TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)`,
		`CREATE TABLE ` + t.of("rejections") + ` (order_id TEXT NOT NULL, reason TEXT NOT NULL)`,
		`CREATE TABLE ` + t.of("order_log") + ` (event_id TEXT NOT NULL, order_id TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)`,
		`INSERT INTO ` + t.of("orders") + ` (order_id) VALUES ('o-1'), ('o-2'), ('o-3'), ('o-4'), ('o-5'), ('o-6')`,
		`INSERT INTO ` + t.of("stock") + ` (sku, available) VALUES ('book', 10), ('lamp', 5), ('piano', 0)`,
	}
}

type orderCreated struct {
	EventID   string `json:"eventId"`
	OrderID   string `json:"orderId"`
	SKU       string `json:"sku"`
	Qty       int    `json:"qty"`
	FailTimes int    `json:"failTimes"` // the scenario: the stock service times out on the first attempts
}

func (inv *inventory) reserve(msg *message.Message) ([]*message.Message, error) {
	var o orderCreated
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, err // a JSON error is classified Poison
	}
	ctx := msg.Context()
	tx := sluicesql.TxFromContext(ctx)
	if attempt, _ := sluice.Attempt(msg); attempt <= o.FailTimes {
		return nil, fmt.Errorf("stock service: %w", context.DeadlineExceeded) // Transient: parked in a tier
	}
	var exists int
	if err := tx.GetContext(ctx, &exists, tx.Rebind(`SELECT count(*) FROM `+inv.tables.of("orders")+` WHERE order_id = ?`), o.OrderID); err != nil {
		return nil, err
	}
	if exists == 0 {
		return nil, sluice.Invariant(fmt.Errorf("order %s must exist before its reservation", o.OrderID))
	}
	var available int
	if err := tx.GetContext(ctx, &available, tx.Rebind(`SELECT available FROM `+inv.tables.of("stock")+` WHERE sku = ?`), o.SKU); err != nil {
		return nil, err
	}
	if available < o.Qty {
		return inv.rejectOrder(msg, tx, o)
	}
	if _, err := tx.ExecContext(ctx, tx.Rebind(`UPDATE `+inv.tables.of("stock")+` SET available = available - ? WHERE sku = ?`), o.Qty, o.SKU); err != nil {
		return nil, err
	}
	_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO `+inv.tables.of("reservations")+` (order_id, sku, qty) VALUES (?, ?, ?)`), o.OrderID, o.SKU, o.Qty)
	return nil, err
}

// rejectOrder records the rejection in the transaction and returns its
// event with a rejection: the outbox writes the event in the same
// transaction, committed with the claim and acked.
func (inv *inventory) rejectOrder(msg *message.Message, tx *sqlx.Tx, o orderCreated) ([]*message.Message, error) {
	ctx := msg.Context()
	if _, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO `+inv.tables.of("rejections")+` (order_id, reason) VALUES (?, ?)`), o.OrderID, errOutOfStock.Error()); err != nil {
		return nil, err
	}
	evt := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"orderId":%q,"reason":%q}`, o.OrderID, errOutOfStock))
	evt.Metadata.Set(sluice.EventIDKey, "rejected:"+o.EventID)
	evt.Metadata.Set(sluice.EventTypeKey, rejectedTopic)
	return []*message.Message{evt}, sluice.Reject(fmt.Errorf("order %s: %w", o.OrderID, errOutOfStock))
}
