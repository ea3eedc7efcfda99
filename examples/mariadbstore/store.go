// Package mariadbstore is a deduplication.Store written the way a third
// party would write one: outside Sluice's core packages, on their public API
// only, in a few dozen lines. It keeps the inbox in a MariaDB/MySQL (InnoDB)
// table, claims with INSERT IGNORE (a concurrent claim of the same key waits
// on the row lock until the first transaction ends) and gives the handler
// its *sql.Tx through TxFromContext, built on unitofwork.FromContext.
// It passes deduplicationtest.Run.
package mariadbstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/unitofwork"
)

// Config configures a Store.
type Config struct {
	// DB is the MariaDB or MySQL database of the business writes. Required.
	DB *sql.DB
	// Table is the inbox table. Default "sluice_inbox".
	Table string
}

// Store is the inbox on MariaDB. It is safe for concurrent use.
type Store struct {
	db    *sql.DB
	table string
}

var _ deduplication.Store = (*Store)(nil)

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// New validates cfg and returns a Store.
func New(cfg Config) (*Store, error) {
	if cfg.DB == nil {
		return nil, errors.New("mariadbstore: Config.DB is required")
	}
	if cfg.Table == "" {
		cfg.Table = "sluice_inbox"
	}
	if !identifier.MatchString(cfg.Table) {
		return nil, fmt.Errorf("mariadbstore: Config.Table %q is not an identifier", cfg.Table)
	}
	return &Store{db: cfg.DB, table: "`" + cfg.Table + "`"}, nil
}

// CreateTable creates the inbox table if it does not exist. The key columns
// are binary: MariaDB's default collations would make "Key" and "key" (and
// "key" and "key ") one key — the conformance suite caught it.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.table+` (
		consumer VARBINARY(255) NOT NULL, event_key VARBINARY(512) NOT NULL,
		processed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		PRIMARY KEY (consumer, event_key)) ENGINE=InnoDB`)
	return err
}

// Begin opens the delivery's transaction.
func (s *Store) Begin(ctx context.Context) (unitofwork.Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &unit{tx: tx, s: s}, nil
}

type unit struct {
	tx *sql.Tx
	s  *Store
}

func (u *unit) Claim(ctx context.Context, consumer, key string) (bool, error) {
	res, err := u.tx.ExecContext(ctx, `INSERT IGNORE INTO `+u.s.table+` (consumer, event_key) VALUES (?, ?)`, consumer, key)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (u *unit) Commit(context.Context) error { return u.tx.Commit() }

func (u *unit) Rollback(context.Context) error {
	if err := u.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// TxFromContext returns the transaction of the delivery being handled, or
// nil outside the inbox stage with a Store of this package.
func TxFromContext(ctx context.Context) *sql.Tx {
	if u, ok := unitofwork.FromContext(ctx).(*unit); ok {
		return u.tx
	}
	return nil
}
