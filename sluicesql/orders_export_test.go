package sluicesql

import (
	"context"

	"github.com/sluicemq/sluice/ordering"
)

// CreateOrdersTables is s's createTables, which Migrate runs.
func CreateOrdersTables(ctx context.Context, s ordering.Store) error {
	return s.(*orders).createTables(ctx)
}
