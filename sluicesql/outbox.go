package sluicesql

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/propagation"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/outbox"
)

// Defaults.
const (
	// outboxTableDefault is the outbox table's default name
	// (OutboxConfig.Table's).
	outboxTableDefault = "sluice_outbox"
	// outboxLeaseDefault is how long Due leases a batch on SQLite when its
	// context has no deadline.
	outboxLeaseDefault = 2 * time.Minute
	// outboxTopicMaxLength bounds a row's topic, in bytes.
	outboxTopicMaxLength = 255
)

// OutboxConfig configures NewOutbox. Every field is optional.
type OutboxConfig struct {
	// Table is the outbox table: a name, or schema.name on PostgreSQL, each
	// part an SQL identifier. Quoted, so case matters. Default
	// "sluice_outbox".
	Table string
	// Checker, when set, is asked about each message as it is written: one
	// its publisher would refuse, or its broker could not carry, whenever
	// it is published (a header name over 255 bytes, more headers than a
	// consumer reads, a CC or BCC header, a body over the broker's
	// max_message_size) is not written — Publish and Write fail with its
	// reason, classified sluice.Poison — rather than stored to fail every
	// publish. Give it the relay's publisher (rabbitmq.Publisher is a
	// broker.PublishChecker). Default none: nothing checked.
	Checker broker.PublishChecker
}

// Outbox is the outbox table on PostgreSQL (lib/pq or pgx) or SQLite:
// produced messages are its rows, written in the inbox's transaction
// (Publish) or in a transaction of your own (Write), and read, deleted and
// marked by outbox.Relay. It is an outbox.Writer (Publish, in the inbox's
// transaction) and an outbox.Store (for outbox.Relay); an operator reads
// and settles its rows with Stats, List, RetryNow, Requeue and Discard. It
// is safe for concurrent use.
//
// Each message written carries the W3C trace context (and baggage) of the
// delivery being handled, or of ctx in Write, unless it carries trace
// context fields already: a producer that propagates otherwise injects its
// own into the message's metadata before writing it.
type Outbox struct {
	db      *sqlx.DB
	dialect outboxDialect
	table   string // quoted
	name    string // as configured, unquoted
	last    string // last part, unquoted
	wake    chan struct{}
	prop    propagation.TextMapPropagator
	check   broker.PublishChecker
}

var (
	_ outbox.Writer = (*Outbox)(nil)
	_ outbox.Store  = (*Outbox)(nil)
)

// NewOutbox validates cfg and returns the outbox table on db, the database
// of the business writes, the inbox's; its driver picks the dialect:
// "postgres" or "pgx" for PostgreSQL, "sqlite" or "sqlite3" for SQLite (a
// plain *sql.DB: sqlx.NewDb(db, driverName)). It
// does not touch the database: Stores.Migrate creates the table. New
// builds one (Stores.Outbox).
func NewOutbox(db *sqlx.DB, cfg OutboxConfig) (*Outbox, error) {
	cfg.Table = cmp.Or(cfg.Table, outboxTableDefault)
	d, err := dialectOf("NewOutbox", db, outboxDialects)
	if err != nil {
		return nil, err
	}
	quoted, last, err := sqlname.Quote(cfg.Table, d.schemas)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: OutboxConfig.Table: %w", err)
	}
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return &Outbox{db: db, dialect: d, table: quoted, name: cfg.Table, last: last, wake: make(chan struct{}, 1), prop: prop, check: cfg.Checker}, nil
}

// Name is the table's name as configured: the relay's metrics label.
func (s *Outbox) Name() string { return s.name }

// schemaSQL returns the statements that create the outbox table and its
// index, as createTable runs them (on PostgreSQL, with the statement that
// adds dead_at to a table of an earlier version).
func (s *Outbox) schemaSQL() string {
	stmts := s.schema()
	if s.dialect.addDead != "" {
		stmts = append(stmts, fmt.Sprintf(s.dialect.addDead, s.table))
	}
	return strings.Join(stmts, ";\n") + ";\n"
}

func (s *Outbox) schema() []string {
	return []string{
		fmt.Sprintf(s.dialect.table, s.table),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (next_attempt_at)`, `"`+sqlname.Index(s.last, "_next_attempt", "nat")+`"`, s.table),
	}
}

// createTable creates the outbox table and its index if they do not exist,
// and migrates a table of an earlier version (adds its dead_at column):
// Stores.Migrate runs it.
func (s *Outbox) createTable(ctx context.Context) error {
	for _, stmt := range s.schema() {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("sluicesql: outbox: creating outbox table %s: %w", s.table, err)
		}
	}
	if err := s.migrateDead(ctx); err != nil {
		return fmt.Errorf("sluicesql: outbox: adding dead_at to %s: %w", s.table, err)
	}
	return nil
}

// migrateDead adds the dead_at column to a table created before it.
func (s *Outbox) migrateDead(ctx context.Context) error {
	if s.dialect.addDead != "" {
		_, err := s.db.ExecContext(ctx, fmt.Sprintf(s.dialect.addDead, s.table))
		return err
	}
	// SQLite has no ADD COLUMN IF NOT EXISTS.
	var n int
	if err := s.db.GetContext(ctx, &n, `SELECT count(*) FROM pragma_table_info(?) WHERE name = 'dead_at'`, s.last); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `ALTER TABLE `+s.table+` ADD COLUMN dead_at INTEGER`)
	return err
}

// Wakeups signals rows committed through Publish in this process (and
// Wake): the relay of this store publishes them without waiting for its
// poll.
func (s *Outbox) Wakeups() <-chan struct{} { return s.wake }

// Wake signals the relay that rows were committed: call it after
// committing a transaction Write wrote in.
func (s *Outbox) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
