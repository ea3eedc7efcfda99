package sluicesql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sluicemq/sluice/internal/metadatacodec"
	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/internal/sqlstate"
	"github.com/sluicemq/sluice/ordering"
)

// The ordering store's defaults.
const (
	// ordersTablePrefixDefault names the tables: <prefix>_keys and
	// <prefix>_held (OrdersConfig.TablePrefix's default).
	ordersTablePrefixDefault = "sluice_order"
	// ordersLockTimeoutDefault is OrdersConfig.LockTimeout's default.
	ordersLockTimeoutDefault = 5 * time.Second
	// ordersIdleTimeoutDefault is OrdersConfig.IdleTimeout's default.
	ordersIdleTimeoutDefault = time.Minute
)

// OrdersConfig configures NewOrders. Every field is optional.
type OrdersConfig struct {
	// TablePrefix names the two tables, <prefix>_keys and <prefix>_held: an
	// SQL identifier, or schema.identifier. Default "sluice_order".
	TablePrefix string
	// LockTimeout bounds a Lock's wait for a key another delivery or a
	// release holds. Default 5 s.
	LockTimeout time.Duration
	// IdleTimeout bounds how long a key's unit of work may sit idle —
	// while the handler runs the key's head or a held message, between two
	// of its statements — before PostgreSQL ends it
	// (idle_in_transaction_session_timeout, set for the transaction alone)
	// and the key's lock with it: a process that hangs while it holds a key
	// (stopped, its link stalled) holds it no longer, and another process —
	// the partition's next owner — goes on with the key's release. Keep it
	// above the handler's longest run (Watermill's Timeout on the router):
	// a run that outlasts it loses its unit of work, and the release is
	// taken up again from the first message not removed (what already ran
	// is the inbox's duplicate). Default 1 min.
	IdleTimeout time.Duration
}

// orders is NewOrders' ordering.Store.
type orders struct {
	db          *sqlx.DB
	keys, held  string // quoted table names
	name        string // the prefix's last part, for index names
	lockTimeout string
	idleTimeout string
}

// NewOrders validates cfg and returns the ordering stage's ordering.Store
// on db, the inbox's PostgreSQL database (driver "postgres" or "pgx"; a
// plain *sql.DB: sqlx.NewDb(db, driverName)): a key's unit of work is a
// transaction that locks the key's row (SELECT ... FOR UPDATE, waiting at
// most LockTimeout), so a release and a hold of one key never interleave,
// whichever process runs them; one left idle longer than IdleTimeout (its
// process hung) is ended by PostgreSQL, which frees the key. Its tables are
// <prefix>_keys and <prefix>_held. It does not touch the database:
// Stores.Migrate creates the tables. New builds one on PostgreSQL
// (Stores.Order). It is safe for concurrent use.
func NewOrders(db *sqlx.DB, cfg OrdersConfig) (ordering.Store, error) {
	if db == nil {
		return nil, errNoDB("NewOrders")
	}
	if d := db.DriverName(); d != "postgres" && d != "pgx" {
		return nil, fmt.Errorf("sluicesql: NewOrders: driver %q is not supported (want postgres or pgx)", d)
	}
	if cfg.LockTimeout < 0 {
		return nil, fmt.Errorf("sluicesql: OrdersConfig.LockTimeout must be positive, got %s", cfg.LockTimeout)
	}
	if cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("sluicesql: OrdersConfig.IdleTimeout must be positive, got %s", cfg.IdleTimeout)
	}
	prefix := cmp.Or(cfg.TablePrefix, ordersTablePrefixDefault)
	keys, name, err := sqlname.Quote(prefix+"_keys", true)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: OrdersConfig.TablePrefix: %w", err)
	}
	held, _, err := sqlname.Quote(prefix+"_held", true)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: OrdersConfig.TablePrefix: %w", err)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%dms", max(d.Milliseconds(), 1)) }
	return &orders{db: db, keys: keys, held: held, name: strings.TrimSuffix(name, "_keys"),
		lockTimeout: ms(cmp.Or(cfg.LockTimeout, ordersLockTimeoutDefault)), idleTimeout: ms(cmp.Or(cfg.IdleTimeout, ordersIdleTimeoutDefault))}, nil
}

func (s *orders) schema() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + s.keys + ` (
	consumer text NOT NULL,
	order_key text NOT NULL,
	head text NOT NULL,
	poisoned boolean NOT NULL DEFAULT false,
	reason text NOT NULL DEFAULT '',
	since timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, order_key))`,
		`CREATE TABLE IF NOT EXISTS ` + s.held + ` (
	seq bigserial PRIMARY KEY,
	consumer text NOT NULL,
	order_key text NOT NULL,
	event_id text NOT NULL,
	uuid text NOT NULL,
	payload bytea NOT NULL,
	metadata bytea NOT NULL,
	held_at timestamptz NOT NULL DEFAULT now(),
	UNIQUE (consumer, order_key, event_id))`,
		`CREATE INDEX IF NOT EXISTS "` + sqlname.Index(s.name, "_held_key", "ohk") + `" ON ` + s.held + ` (consumer, order_key, seq)`,
	}
}

// createTables creates the two tables and their index if they do not
// exist: Stores.Migrate runs it.
func (s *orders) createTables(ctx context.Context) error {
	for _, stmt := range s.schema() {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("sluicesql: orders: creating the tables: %w", err)
		}
	}
	return nil
}

// Lock begins a transaction and locks the key's row, if it has one. It
// returns within ctx, even where the driver would not (lib/pq dialing a
// black-holed server); the transaction lives until Commit or Rollback, not
// until ctx ends.
func (s *orders) Lock(ctx context.Context, consumer, key string) (ordering.Guard, error) {
	type result struct {
		g   *ordersGuard
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := s.lock(context.WithoutCancel(ctx), consumer, key)
		done <- result{g, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		return r.g, nil
	case <-ctx.Done():
		go func() { // the transaction nobody will end
			if r := <-done; r.g != nil {
				_ = r.g.tx.Rollback()
			}
		}()
		return nil, fmt.Errorf("sluicesql: orders: locking the key: %w", context.Cause(ctx))
	}
}

func (s *orders) lock(ctx context.Context, consumer, key string) (*ordersGuard, error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: orders: begin: %w", err)
	}
	g := &ordersGuard{s: s, tx: tx, consumer: consumer, key: key}
	// Both for this transaction alone, in one round trip: the wait for the
	// key's lock, and how long the transaction may sit idle holding it.
	if _, err := tx.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)`,
		s.lockTimeout, s.idleTimeout); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("sluicesql: orders: setting the lock and idle timeouts: %w", err)
	}
	var st ordering.Key
	err = tx.QueryRowContext(ctx, `SELECT head, poisoned, reason, since FROM `+s.keys+` WHERE consumer = $1 AND order_key = $2 FOR UPDATE`,
		consumer, key).Scan(&st.Head, &st.Poisoned, &st.Reason, &st.Since)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		_ = tx.Rollback()
		if state, ok := sqlstate.Of(err); ok && state == "55P03" { // lock_not_available: lock_timeout passed
			return nil, fmt.Errorf("%w: %w", errLockTimeout, err)
		}
		return nil, fmt.Errorf("sluicesql: orders: locking the key: %w", err)
	default:
		st.Key = key
		g.st = &st
	}
	return g, nil
}

// errLockTimeout is Lock's error when the key stayed locked by another unit
// of work for longer than LockTimeout.
var errLockTimeout = errors.New("ordering: the key is locked by another delivery")

// Waits reports whether the key has a row: one statement, no transaction.
func (s *orders) Waits(ctx context.Context, consumer, key string) (bool, error) {
	var found bool
	if err := s.db.GetContext(ctx, &found, `SELECT EXISTS (SELECT 1 FROM `+s.keys+` WHERE consumer = $1 AND order_key = $2)`, consumer, key); err != nil {
		return false, fmt.Errorf("sluicesql: orders: reading the key: %w", err)
	}
	return found, nil
}

// Releasable returns keys whose head is done and that hold messages,
// skipping locked ones.
func (s *orders) Releasable(ctx context.Context, consumer string, limit int) ([]string, error) {
	var keys []string
	err := s.db.SelectContext(ctx, &keys, `SELECT k.order_key FROM `+s.keys+` k WHERE k.consumer = $1 AND k.head = ''
	AND EXISTS (SELECT 1 FROM `+s.held+` h WHERE h.consumer = k.consumer AND h.order_key = k.order_key)
	ORDER BY k.since LIMIT $2 FOR UPDATE SKIP LOCKED`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: orders: listing the keys to release: %w", err)
	}
	return keys, nil
}

// Keys returns the waiting keys, the oldest first.
func (s *orders) Keys(ctx context.Context, consumer string, limit int) ([]ordering.Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT k.order_key, k.head, k.poisoned, k.reason, k.since,
	(SELECT count(*) FROM `+s.held+` h WHERE h.consumer = k.consumer AND h.order_key = k.order_key)
	FROM `+s.keys+` k WHERE k.consumer = $1 ORDER BY k.since, k.order_key LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: orders: listing the keys: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []ordering.Key
	for rows.Next() {
		var k ordering.Key
		if err := rows.Scan(&k.Key, &k.Head, &k.Poisoned, &k.Reason, &k.Since, &k.Held); err != nil {
			return nil, fmt.Errorf("sluicesql: orders: listing the keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// Stats counts the waiting keys.
func (s *orders) Stats(ctx context.Context, consumer string) (ordering.Stats, error) {
	var st ordering.Stats
	var oldest sql.NullTime
	err := s.db.QueryRowContext(ctx, `SELECT
	count(*) FILTER (WHERE head <> '' AND NOT poisoned),
	count(*) FILTER (WHERE head <> '' AND poisoned),
	count(*) FILTER (WHERE head = ''),
	min(since),
	(SELECT count(*) FROM `+s.held+` WHERE consumer = $1)
	FROM `+s.keys+` WHERE consumer = $1`, consumer).Scan(&st.Blocked, &st.Poisoned, &st.Releasing, &oldest, &st.Held)
	if err != nil {
		return st, fmt.Errorf("sluicesql: orders: counting the keys: %w", err)
	}
	st.Oldest = oldest.Time
	return st, nil
}

type ordersGuard struct {
	s             *orders
	tx            *sqlx.Tx
	consumer, key string
	st            *ordering.Key // nil: the key has no row
}

func (g *ordersGuard) State(context.Context) (ordering.Key, bool, error) {
	if g.st == nil {
		return ordering.Key{}, false, nil
	}
	return *g.st, true, nil
}

func (g *ordersGuard) Hold(ctx context.Context, m ordering.Held) error {
	_, err := g.tx.ExecContext(ctx, `INSERT INTO `+g.s.held+` (consumer, order_key, event_id, uuid, payload, metadata)
	VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer, order_key, event_id) DO NOTHING`,
		g.consumer, g.key, m.EventID, m.UUID, ordersNonNil(m.Payload), metadatacodec.Encode(m.Metadata))
	if err != nil {
		return fmt.Errorf("sluicesql: orders: holding: %w", err)
	}
	return nil
}

func (g *ordersGuard) Block(ctx context.Context, head string, poisoned bool, reason string) error {
	_, err := g.tx.ExecContext(ctx, `INSERT INTO `+g.s.keys+` (consumer, order_key, head, poisoned, reason) VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT (consumer, order_key) DO UPDATE SET head = EXCLUDED.head, poisoned = EXCLUDED.poisoned, reason = EXCLUDED.reason`,
		g.consumer, g.key, head, poisoned, strings.ToValidUTF8(strings.ReplaceAll(reason, "\x00", ""), "?"))
	if err != nil {
		return fmt.Errorf("sluicesql: orders: blocking: %w", err)
	}
	if g.st == nil {
		g.st = &ordering.Key{Key: g.key, Since: time.Now()}
	}
	g.st.Head, g.st.Poisoned, g.st.Reason = head, poisoned, reason
	return nil
}

func (g *ordersGuard) Unblock(ctx context.Context) error {
	if g.st == nil {
		return nil
	}
	res, err := g.tx.ExecContext(ctx, `DELETE FROM `+g.s.keys+` k WHERE k.consumer = $1 AND k.order_key = $2
	AND NOT EXISTS (SELECT 1 FROM `+g.s.held+` h WHERE h.consumer = $1 AND h.order_key = $2)`, g.consumer, g.key)
	if err != nil {
		return fmt.Errorf("sluicesql: orders: unblocking: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		g.st = nil
		return nil
	}
	if _, err := g.tx.ExecContext(ctx, `UPDATE `+g.s.keys+` SET head = '', poisoned = false, reason = '' WHERE consumer = $1 AND order_key = $2`,
		g.consumer, g.key); err != nil {
		return fmt.Errorf("sluicesql: orders: unblocking: %w", err)
	}
	g.st.Head, g.st.Poisoned, g.st.Reason = "", false, ""
	return nil
}

func (g *ordersGuard) Next(ctx context.Context) (ordering.Held, bool, error) {
	var m ordering.Held
	var md []byte
	err := g.tx.QueryRowContext(ctx, `SELECT event_id, uuid, payload, metadata, held_at FROM `+g.s.held+`
	WHERE consumer = $1 AND order_key = $2 ORDER BY seq LIMIT 1`, g.consumer, g.key).Scan(&m.EventID, &m.UUID, &m.Payload, &md, &m.HeldAt)
	if errors.Is(err, sql.ErrNoRows) {
		return m, false, nil
	}
	if err != nil {
		return m, false, fmt.Errorf("sluicesql: orders: reading the next held message: %w", err)
	}
	if m.Metadata, err = metadatacodec.Decode(md); err != nil {
		return m, false, fmt.Errorf("sluicesql: orders: the held message %q: %w", m.EventID, err)
	}
	return m, true, nil
}

func (g *ordersGuard) Remove(ctx context.Context, id string) error {
	if _, err := g.tx.ExecContext(ctx, `DELETE FROM `+g.s.held+` WHERE consumer = $1 AND order_key = $2 AND event_id = $3`,
		g.consumer, g.key, id); err != nil {
		return fmt.Errorf("sluicesql: orders: removing a held message: %w", err)
	}
	return nil
}

func (g *ordersGuard) Commit(context.Context) error {
	if err := g.tx.Commit(); err != nil {
		return fmt.Errorf("sluicesql: orders: commit: %w", err)
	}
	return nil
}

func (g *ordersGuard) Rollback(context.Context) error {
	if err := g.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

func ordersNonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
