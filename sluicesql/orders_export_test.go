package sluicesql

import "context"

// CreateOrdersTables is s's createTables, which Migrate runs.
func CreateOrdersTables(ctx context.Context, s *Orders) error { return s.createTables(ctx) }
