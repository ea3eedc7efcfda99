package sluicesql

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/ordering"
)

// Config configures New.
type Config struct {
	// Schema is the PostgreSQL schema the tables are in: Migrate creates
	// it when it does not exist. Default none: the connection's
	// search_path. SQLite has none.
	Schema string
	// Inbox, Outbox, Outcomes and Order configure the four stores, as
	// NewInbox, NewOutbox, NewOutcomes and NewOrders take them, but for
	// their tables' names: each an SQL identifier alone, which Schema
	// qualifies (defaults "sluice_inbox", "sluice_outbox", "sluice_replay",
	// and the prefix "sluice_order"). Give Outbox.Checker the relay's
	// publisher (service.New does). Order is PostgreSQL's only.
	Inbox    InboxConfig
	Outbox   OutboxConfig
	Outcomes OutcomesConfig
	Order    OrdersConfig
}

// Stores are Sluice's three tables on one database. Safe for concurrent
// use.
type Stores struct {
	// Inbox is the inbox (deduplication.Config.Store); its units of work
	// are the database's transactions.
	Inbox *Inbox
	// Outbox holds what handlers produce until a relay publishes it
	// (router.HandlerConfig.Outbox, outbox.RelayConfig.Store).
	Outbox *Outbox
	// Outcomes records what became of each message replayed from a poison
	// queue (replay.Config.Store), for sluice dlq replay and report.
	Outcomes *Outcomes
	// Order keeps the ordering stage's waiting keys and held messages
	// (ordering.Config.Store; docs/ordering.md) on PostgreSQL, its tables
	// <Config.Order.TablePrefix>_keys and _held; nil on SQLite, which it
	// does not support.
	Order ordering.Store

	db     *sqlx.DB
	schema string // Config.Schema, quoted; "" without one
}

// New validates cfg and returns the stores on db, the database of the
// tables and of the handlers' own writes: PostgreSQL (driver "postgres" or
// "pgx") or SQLite ("sqlite", "sqlite3"); a plain *sql.DB is
// sqlx.NewDb(db, driverName). It does not touch the database: Migrate
// creates the tables.
func New(db *sqlx.DB, cfg Config) (*Stores, error) {
	if db == nil {
		return nil, errNoDB("New")
	}
	var err error
	if cfg.Schema != "" && !postgres(db) {
		return nil, fmt.Errorf("sluicesql: Config.Schema is PostgreSQL's; the database's driver is %q", db.DriverName())
	}
	table := func(field, name, def string) (string, error) {
		if name == "" {
			name = def
		}
		if strings.Contains(name, ".") {
			return "", fmt.Errorf("sluicesql: Config.%s %q: a table's name only (Config.Schema qualifies it)", field, name)
		}
		if cfg.Schema != "" {
			name = cfg.Schema + "." + name
		}
		return name, nil
	}
	var errs [4]error
	var names [4]string
	names[0], errs[0] = table("Inbox.Table", cfg.Inbox.Table, inboxTableDefault)
	names[1], errs[1] = table("Outbox.Table", cfg.Outbox.Table, outboxTableDefault)
	names[2], errs[2] = table("Outcomes.Table", cfg.Outcomes.Table, outcomesTableDefault)
	names[3], errs[3] = table("Order.TablePrefix", cfg.Order.TablePrefix, ordersTablePrefixDefault)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	s := &Stores{db: db}
	if cfg.Schema != "" {
		if s.schema, _, err = sqlname.Quote(cfg.Schema, false); err != nil {
			return nil, fmt.Errorf("sluicesql: Config.Schema: %w", err)
		}
	}
	cfg.Inbox.Table, cfg.Outbox.Table, cfg.Outcomes.Table, cfg.Order.TablePrefix = names[0], names[1], names[2], names[3]
	if s.Inbox, err = NewInbox(db, cfg.Inbox); err != nil {
		return nil, fmt.Errorf("sluicesql: the inbox (Config.Inbox, Config.Schema): %w", err)
	}
	if s.Outbox, err = NewOutbox(db, cfg.Outbox); err != nil {
		return nil, fmt.Errorf("sluicesql: the outbox (Config.Outbox, Config.Schema): %w", err)
	}
	if s.Outcomes, err = NewOutcomes(db, cfg.Outcomes); err != nil {
		return nil, fmt.Errorf("sluicesql: the replay outcomes (Config.Outcomes, Config.Schema): %w", err)
	}
	if postgres(db) {
		if s.Order, err = NewOrders(db, cfg.Order); err != nil {
			return nil, fmt.Errorf("sluicesql: the ordering store (Config.Order, Config.Schema): %w", err)
		}
	}
	return s, nil
}

// DB is the database the stores are on.
func (s *Stores) DB() *sqlx.DB { return s.db }

// migrateLock is the PostgreSQL advisory lock Migrate holds, so that
// several instances starting at once create each table once (two CREATE
// TABLE IF NOT EXISTS racing can fail on PostgreSQL's catalog).
var migrateLock = func() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("github.com/sluicemq/sluice/sluicesql.Migrate"))
	return int64(h.Sum64())
}()

// unlockTimeout bounds the release of the migration lock after a ctx that
// ended (the session's end releases it too).
const unlockTimeout = 5 * time.Second

// Migrate creates the inbox, outbox and outcome tables and their indexes
// where they do not exist, and brings an older version's to this one's
// shape (the stores' CreateTable): idempotent, and safe to run from
// several instances at once (on PostgreSQL it holds an advisory lock for
// its duration). Bounded by ctx.
func (s *Stores) Migrate(ctx context.Context) (err error) {
	if postgres(s.db) {
		conn, err := s.db.Connx(ctx)
		if err != nil {
			return fmt.Errorf("sluicesql: migrating: %w", err)
		}
		defer func() { _ = conn.Close() }()
		if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, migrateLock); err != nil {
			return fmt.Errorf("sluicesql: migrating: taking the migration lock: %w", err)
		}
		defer func() {
			unlock, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
			defer cancel()
			if _, uerr := conn.ExecContext(unlock, `SELECT pg_advisory_unlock($1)`, migrateLock); uerr != nil && err == nil {
				err = fmt.Errorf("sluicesql: migrating: releasing the migration lock: %w", uerr)
			}
		}()
		if err := s.createSchema(ctx, conn); err != nil {
			return err
		}
	}
	for _, m := range []struct {
		what   string
		create func(context.Context) error
	}{{"the inbox", s.Inbox.CreateTable}, {"the outbox", s.Outbox.createTable}, {"the replay outcomes", s.Outcomes.CreateTable},
		{"the ordering store", func(ctx context.Context) error {
			if s.Order == nil {
				return nil
			}
			return s.Order.(*orders).createTables(ctx)
		}}} {
		if err := m.create(ctx); err != nil {
			return fmt.Errorf("sluicesql: migrating %s: %w", m.what, err)
		}
	}
	return nil
}

// createSchema creates Config.Schema where it does not exist. One that
// exists is left alone, so a role without the database's CREATE privilege
// migrates into a schema an administrator made for it.
func (s *Stores) createSchema(ctx context.Context, conn *sqlx.Conn) error {
	if s.schema == "" {
		return nil
	}
	name := s.schema[1 : len(s.schema)-1]
	var exists bool
	if err := conn.GetContext(ctx, &exists, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name); err != nil {
		return fmt.Errorf("sluicesql: migrating: looking for schema %s: %w", s.schema, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.schema); err != nil {
		return fmt.Errorf("sluicesql: migrating: creating schema %s (or have it created: CREATE SCHEMA %s AUTHORIZATION <the service's role>): %w", s.schema, s.schema, err)
	}
	return nil
}

func postgres(db *sqlx.DB) bool { return db.DriverName() == "postgres" || db.DriverName() == "pgx" }
