package sluicesql

import (
	"context"

	"github.com/jmoiron/sqlx"
)

// OutboxDB is s's database.
func OutboxDB(s *Outbox) *sqlx.DB { return s.db }

// CreateOutboxTable is s's createTable, which Migrate runs.
func CreateOutboxTable(ctx context.Context, s *Outbox) error { return s.createTable(ctx) }

// OutboxSchemaSQL is s's schemaSQL.
func OutboxSchemaSQL(s *Outbox) string { return s.schemaSQL() }
