package sluicesql

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/sqldb"
	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/internal/sqlstate"
	"github.com/sluicemq/sluice/unitofwork"
)

// inboxTableDefault is InboxConfig.Table's default.
const inboxTableDefault = "sluice_inbox"

// InboxConfig configures an Inbox (NewInbox).
type InboxConfig struct {
	// Table is the inbox table: a name, or schema.name on PostgreSQL, each
	// part an SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes). It is
	// quoted, so case matters. Default "sluice_inbox".
	Table string
	// TxOptions are used for each delivery's transaction. Default nil: the
	// driver's default (READ COMMITTED on PostgreSQL).
	TxOptions *sql.TxOptions
}

// Inbox is the inbox's store (deduplication.Config.Store) on PostgreSQL or
// SQLite. Its units of work are SQL
// transactions (TxFromContext): a claim is an INSERT ... ON CONFLICT DO
// NOTHING into the inbox table, so a concurrent claim of the same key waits
// on the primary key until the first transaction ends. It is safe for
// concurrent use.
type Inbox struct {
	db      *sqlx.DB
	dialect dialect
	table   string // quoted, possibly schema-qualified
	name    string // unquoted last part, for index names
	opts    *sql.TxOptions
	claim   string
	// claimBatch claims many keys in one statement, returning those claimed.
	claimBatch string
	// claimBatchBounded is claimBatch setting lock_timeout ($3) and
	// idle_in_transaction_session_timeout ($4) first (PostgreSQL); "" on
	// SQLite. claimBatchLiteral is it with literal values (%s), for one
	// simple query on lib/pq; "" elsewhere.
	claimBatchBounded, claimBatchLiteral string
	// claimIdle is claim bounding the transaction's idle time too
	// (PostgreSQL); "" on SQLite.
	claimIdle string
	prune     string
	// claimLiteral is the claim with its values as literals (%s, %s), for
	// ClaimAfter's one round trip on lib/pq; "" elsewhere.
	claimLiteral string
}

var (
	_ deduplication.Store        = (*Inbox)(nil)
	_                            = PrunerConfig{Store: (*Inbox)(nil)}
	_ deduplication.IdleBounder  = (*sqlTx)(nil)
	_ deduplication.BatchClaimer = (*sqlTx)(nil)
	// Group commit claims through ClaimAfter where a unit of work has it.
	_ interface {
		unitofwork.Savepointer
		ClaimAfter(ctx context.Context, release, savepoint, consumer, key string, wait time.Duration) (bool, error)
	} = (*sqlTx)(nil)
)

// errNoDB is the error of a constructor (what) given no database.
func errNoDB(what string) error {
	return fmt.Errorf("sluicesql: %s: the DB is required (a plain *sql.DB: sqlx.NewDb(db, driverName))", what)
}

// dialectOf is the dialect in dialects of db's driver (PostgreSQL's or
// SQLite's), the errors naming the constructor (what): no database, or a
// driver the stores speak no SQL of.
func dialectOf[D any](what string, db *sqlx.DB, dialects map[string]D) (D, error) {
	var none D
	if db == nil {
		return none, errNoDB(what)
	}
	d, ok := dialects[db.DriverName()]
	if !ok {
		return none, fmt.Errorf("sluicesql: %s: driver %q is not supported (want postgres, pgx, sqlite or sqlite3)", what, db.DriverName())
	}
	return d, nil
}

// withDefaults returns a copy of c with its defaults filled.
func (c InboxConfig) withDefaults() InboxConfig {
	c.Table = cmp.Or(c.Table, inboxTableDefault)
	return c
}

// NewInbox validates cfg and returns an Inbox on db, the database of the
// business writes. Its driver picks the dialect: "postgres" or "pgx" for
// PostgreSQL (lib/pq, pgx's stdlib — a pgxpool through
// stdlib.OpenDBFromPool), "sqlite" (modernc.org/sqlite) or "sqlite3"
// (mattn/go-sqlite3) for SQLite; a plain *sql.DB is sqlx.NewDb(db,
// driverName). It does not touch the database; call CreateTable or apply SchemaSQL first (New and Migrate do
// both for the tables of Stores).
func NewInbox(db *sqlx.DB, cfg InboxConfig) (*Inbox, error) {
	cfg = cfg.withDefaults()
	d, err := dialectOf("NewInbox", db, dialects)
	if err != nil {
		return nil, err
	}
	quoted, name, err := sqlname.Quote(cfg.Table, d.schemas)
	if err != nil {
		return nil, fmt.Errorf("sluicesql: InboxConfig.Table: %w", err)
	}
	s := &Inbox{
		db:      db,
		dialect: d,
		table:   quoted,
		name:    name,
		opts:    cfg.TxOptions,
	}
	s.claim = fmt.Sprintf(d.claim, s.table)
	s.claimBatch = fmt.Sprintf(d.claimBatch, s.table)
	if d.claimBatchBounded != "" {
		s.claimBatchBounded = fmt.Sprintf(d.claimBatchBounded, s.table, "$1", "$2", "$3", "$4")
		if db.DriverName() == "postgres" {
			// The lock_timeout is SET before it in the same query:
			// none here; %[1]s–%[3]s the consumer, keys and idle literals.
			s.claimBatchLiteral = fmt.Sprintf(d.claimBatchBounded, s.table, "%[1]s", "%[2]s", "''", "%[3]s")
		}
	}
	if d.claimIdle != "" {
		s.claimIdle = fmt.Sprintf(d.claimIdle, s.table)
	}
	s.prune = fmt.Sprintf(d.prune, s.table)
	if db.DriverName() == "postgres" { // lib/pq: a simple query may hold several statements
		s.claimLiteral = `INSERT INTO ` + s.table + ` (consumer, event_key, processed_at) VALUES (%s, %s, now()) ON CONFLICT DO NOTHING`
	}
	return s, nil
}

// SchemaSQL returns the statements that create the inbox table and its
// index, as CreateTable runs them.
func (s *Inbox) SchemaSQL() string {
	return strings.Join(s.schema(), ";\n") + ";\n"
}

func (s *Inbox) schema() []string {
	index := `"` + sqlname.Index(s.name, "_processed_at", "pat") + `"`
	return []string{
		fmt.Sprintf(s.dialect.table, s.table),
		fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)", index, s.table),
	}
}

// CreateTable creates the inbox table and its index if they do not exist.
func (s *Inbox) CreateTable(ctx context.Context) error {
	for _, stmt := range s.schema() {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("sluicesql: creating inbox table %s: %w", s.table, err)
		}
	}
	return nil
}

// Begin starts the delivery's SQL transaction.
func (s *Inbox) Begin(ctx context.Context) (unitofwork.Tx, error) {
	tx, err := s.db.BeginTxx(ctx, s.opts)
	if err != nil {
		return nil, err
	}
	return &sqlTx{tx: tx, s: s}, nil
}

// Ping reports whether the inbox answers: a statement that reads its table
// (so a dropped table fails it as a lost connection does), returning within
// ctx even where the driver would not — lib/pq connecting to a server that
// never answers. router.Add gives it to the brake as its Probe, so an outage
// is probed without touching a message.
func (s *Inbox) Ping(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		rows, err := s.db.QueryContext(ctx, `SELECT 1 FROM `+s.table+` LIMIT 0`)
		if err == nil {
			err = errors.Join(rows.Err(), rows.Close())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("sluicesql: ping %s: %w", s.table, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sluicesql: ping %s: %w", s.table, ctx.Err())
	}
}

// DeleteBefore deletes at most limit inbox rows processed before t.
func (s *Inbox) DeleteBefore(ctx context.Context, t time.Time, limit int) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.prune, s.dialect.timeArg(t), limit)
	if err != nil {
		return 0, fmt.Errorf("sluicesql: pruning %s: %w", s.table, err)
	}
	return res.RowsAffected()
}

type sqlTx struct {
	tx *sqlx.Tx
	s  *Inbox
}

// TxFromContext returns the SQL transaction of the delivery being handled,
// in which the inbox record was claimed: the handler's business writes go
// into it so that they commit or roll back with the record. It returns nil
// outside the inbox stage with an Inbox of this package. It is
// unitofwork.FromContext with the unit of work's type made concrete (TxOf).
func TxFromContext(ctx context.Context) *sqlx.Tx { return TxOf(unitofwork.FromContext(ctx)) }

func (t *sqlTx) Claim(ctx context.Context, consumer, key string) (bool, error) {
	res, err := t.tx.ExecContext(ctx, t.s.claim, consumer, key)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// ClaimBatch claims keys in one statement and returns those it claimed
// (deduplication.BatchClaimer, for a batch handler): on PostgreSQL an INSERT
// ... SELECT FROM unnest of the keys as one text[] parameter, on SQLite from
// json_each of them as one JSON parameter, each ON CONFLICT DO NOTHING
// RETURNING the keys inserted. The rows are inserted in the order of keys.
//
// On PostgreSQL, wait > 0 bounds the statement's wait for a key another
// open transaction holds — lock_timeout, set for the claim alone: the
// handler's statements keep their own — and a claim that waited longer
// fails with an error matching deduplication.ErrClaimInProgress, its
// transaction aborted; idle > 0 sets the transaction's
// idle_in_transaction_session_timeout, as ClaimIdle does. On lib/pq both
// are one round trip with the claim; elsewhere the lock_timeout is reset
// by a second statement. On SQLite (one writer: no claim waits) they do
// not apply.
func (t *sqlTx) ClaimBatch(ctx context.Context, consumer string, keys []string, wait, idle time.Duration) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if t.s.claimBatchBounded == "" { // SQLite
		return t.claimBatch(ctx, t.s.claimBatch, consumer, t.s.dialect.keysArg(keys))
	}
	lock, idleMS := "", ""
	if wait > 0 {
		lock = strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
	}
	if idle > 0 {
		idleMS = strconv.FormatInt(max(idle.Milliseconds(), 1), 10)
	}
	if t.s.claimBatchLiteral != "" && (lock != "" || idleMS != "") {
		// lib/pq: one simple query, its values as literals; the claim's
		// rows are the first result's. The lock_timeout reset is the
		// last statement: a claim that timed out aborted the
		// transaction, and the SET with it.
		q := ""
		if lock != "" {
			q = `SET LOCAL lock_timeout = ` + lock + `; `
		}
		q += fmt.Sprintf(t.s.claimBatchLiteral, dollarQuoted(consumer), dollarQuoted(sqldb.TextArray(keys)), dollarQuoted(idleMS))
		if lock != "" {
			q += `; SET LOCAL lock_timeout = DEFAULT`
		}
		claimed, err := t.claimBatch(ctx, q)
		return claimed, claimBatchError(err, wait)
	}
	if lock == "" && idleMS == "" {
		return t.claimBatch(ctx, t.s.claimBatch, consumer, t.s.dialect.keysArg(keys))
	}
	// $3, $4: lock_timeout and idle_in_transaction_session_timeout for the
	// transaction, set before the first row is inserted ("" leaves one as
	// it is).
	claimed, err := t.claimBatch(ctx, t.s.claimBatchBounded, consumer, t.s.dialect.keysArg(keys), lock, idleMS)
	if err != nil {
		return nil, claimBatchError(err, wait)
	}
	if lock != "" {
		if _, err := t.tx.ExecContext(ctx, `SET LOCAL lock_timeout = DEFAULT`); err != nil {
			return nil, err
		}
	}
	return claimed, nil
}

// claimBatch runs the claim query q and returns the keys it returned.
func (t *sqlTx) claimBatch(ctx context.Context, q string, args ...any) ([]string, error) {
	rows, err := t.tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	var claimed []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		claimed = append(claimed, k)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	return claimed, nil
}

// claimBatchError is ClaimBatch's error for err: matching
// deduplication.ErrClaimInProgress when the claim waited past wait.
func claimBatchError(err error, wait time.Duration) error {
	if state, _ := sqlstate.Of(err); state == "55P03" {
		return fmt.Errorf("%w: a key of the batch is held by another transaction longer than %s: %w", deduplication.ErrClaimInProgress, wait, err)
	}
	return err
}

// pgTextArray is keys as a PostgreSQL array literal (sqldb.TextArray; a
// key holds no NUL byte: the inbox refuses such keys).
func pgTextArray(keys []string) any { return sqldb.TextArray(keys) }

// jsonArray is keys as a JSON array, for SQLite's json_each.
func jsonArray(keys []string) any {
	b, _ := json.Marshal(keys) // strings always marshal
	return string(b)
}

// ClaimIdle is Claim, and on PostgreSQL, in the same statement, sets the
// transaction's idle_in_transaction_session_timeout to idle: a process that
// hangs while it holds the claim (stopped, its link stalled) holds it no
// longer (deduplication.IdleBounder). On SQLite it is Claim.
func (t *sqlTx) ClaimIdle(ctx context.Context, consumer, key string, idle time.Duration) (bool, error) {
	if t.s.claimIdle == "" {
		return t.Claim(ctx, consumer, key)
	}
	res, err := t.tx.ExecContext(ctx, t.s.claimIdle, consumer, key, strconv.FormatInt(max(idle.Milliseconds(), 1), 10))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (t *sqlTx) Commit(context.Context) error {
	err := t.tx.Commit()
	if err != nil && aborted(err) {
		return fmt.Errorf("%w: %w", unitofwork.ErrAborted, err)
	}
	return err
}

// aborted reports whether err is the error of a statement refused because
// an earlier one aborted the transaction (PostgreSQL's 25P02), or of a
// commit refused for that reason — lib/pq's ErrInFailedTransaction, pgx's
// ErrTxCommitRollback (matched by their text: the module imports no
// driver), or a deferred constraint violated at commit (class 23): nothing
// more can be written in it. A lost connection or a serialization failure
// at commit is not one.
func aborted(err error) bool {
	if state, ok := sqlstate.Of(err); ok {
		return state == "25P02" || strings.HasPrefix(state, "23")
	}
	msg := err.Error()
	return strings.Contains(msg, "in a failed transaction") || strings.Contains(msg, "commit unexpectedly resulted in rollback")
}

// ClaimAfter releases savepoint release (when not ""), sets savepoint and
// claims (consumer, key) after it: on lib/pq in one simple query whose
// values are dollar-quoted literals, its wait for a concurrent claim
// bounded by the server's lock_timeout (reset for the handler in the same
// round trip); elsewhere in three statements. Group commit claims through
// it.
func (t *sqlTx) ClaimAfter(ctx context.Context, release, savepoint, consumer, key string, wait time.Duration) (bool, error) {
	if t.s.claimLiteral == "" {
		if release != "" {
			if err := t.Release(ctx, release); err != nil {
				return false, err
			}
		}
		if err := t.Savepoint(ctx, savepoint); err != nil {
			return false, err
		}
		// wait is not applied here: on SQLite a batch holds the database's
		// one write lock and no claim waits on another; on pgx a claim
		// waits, and PostgreSQL ends a deadlock between two batches.
		return t.Claim(ctx, consumer, key)
	}
	q := ""
	if release != "" {
		q = `RELEASE SAVEPOINT ` + release + `; `
	}
	q += `SAVEPOINT ` + savepoint + `; `
	claim := fmt.Sprintf(t.s.claimLiteral, dollarQuoted(consumer), dollarQuoted(key))
	if wait <= 0 {
		// The claim last: its row count is the result's.
		res, err := t.tx.ExecContext(ctx, q+claim)
		if err != nil {
			return false, claimAfterError(err, key, wait)
		}
		n, err := res.RowsAffected()
		return n == 1, err
	}
	// The wait is bounded by the server, not by cancelling ctx: lib/pq
	// closes a connection whose statement is cancelled — here the whole
	// batch's. The handler's statements keep their own lock_timeout: the
	// same round trip resets it after the claim (were the claim to fail,
	// rolling back to savepoint would undo the SET), so the claim reports
	// itself by a row (RETURNING), not by the last statement's row count.
	q += fmt.Sprintf(`SET LOCAL lock_timeout = %d; `, max(wait.Milliseconds(), 1)) + claim + ` RETURNING 1; SET LOCAL lock_timeout = DEFAULT`
	rows, err := t.tx.QueryContext(ctx, q)
	if err != nil {
		return false, claimAfterError(err, key, wait)
	}
	claimed := rows.Next()
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return false, claimAfterError(err, key, wait)
	}
	return claimed, nil
}

// claimAfterError is ClaimAfter's error for err: matching
// unitofwork.ErrAborted when the transaction was aborted before it,
// deduplication.ErrClaimInProgress when the claim waited past wait.
func claimAfterError(err error, key string, wait time.Duration) error {
	switch state, _ := sqlstate.Of(err); state {
	case "25P02":
		return fmt.Errorf("%w: %w", unitofwork.ErrAborted, err)
	case "55P03":
		return fmt.Errorf("%w: claim %q waited longer than the claim timeout (%s): %w", deduplication.ErrClaimInProgress, key, wait, err)
	}
	return err
}

// dollarQuoted returns s as a PostgreSQL dollar-quoted string literal, with
// a tag that s cannot end early (whatever standard_conforming_strings is).
// s holds no NUL byte (the inbox refuses such keys).
func dollarQuoted(s string) string {
	tag := "$k$"
	for i := 0; strings.Index(s+tag, tag) != len(s); i++ {
		tag = "$k" + strconv.Itoa(i) + "$"
	}
	return tag + s + tag
}

// Savepoint, RollbackTo and Release make the store's units of work
// deduplication.Savepointers, for group commit (deduplication.BatchConfig).
func (t *sqlTx) Savepoint(ctx context.Context, name string) error {
	_, err := t.tx.ExecContext(ctx, `SAVEPOINT `+name)
	return err
}

func (t *sqlTx) RollbackTo(ctx context.Context, name string) error {
	_, err := t.tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT `+name)
	return err
}

func (t *sqlTx) Release(ctx context.Context, name string) error {
	_, err := t.tx.ExecContext(ctx, `RELEASE SAVEPOINT `+name)
	if err != nil && aborted(err) {
		return fmt.Errorf("%w: %w", unitofwork.ErrAborted, err)
	}
	return err
}

func (t *sqlTx) Rollback(context.Context) error {
	if err := t.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// dialect holds the SQL that differs between databases. %s is the table.
type dialect struct {
	table string
	claim string
	// claimBatch claims many keys ($2: keysArg) and returns those inserted.
	claimBatch string
	// claimBatchBounded is claimBatch that first sets lock_timeout and
	// idle_in_transaction_session_timeout (each "" for as it is): %[1]s
	// the table, %[2]s–%[5]s the consumer, the keys, and the two.
	claimBatchBounded string
	keysArg           func([]string) any
	// claimIdle is claim that also sets the transaction's
	// idle_in_transaction_session_timeout ($3, in ms): "" where the
	// database has none.
	claimIdle string
	prune     string
	schemas   bool
	timeArg   func(time.Time) any
}

var postgresDialect = dialect{
	table: `CREATE TABLE IF NOT EXISTS %s (
	consumer     TEXT        NOT NULL,
	event_key    TEXT        NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (consumer, event_key)
)`,
	claim: `INSERT INTO %s (consumer, event_key, processed_at) VALUES ($1, $2, now()) ON CONFLICT DO NOTHING`,
	// The keys as one text parameter cast to text[]: lib/pq and pgx both
	// send a string as text.
	claimBatch: `INSERT INTO %s (consumer, event_key, processed_at) SELECT $1, k, now() FROM unnest(CAST($2 AS text)::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n ON CONFLICT DO NOTHING RETURNING event_key`,
	claimBatchBounded: `INSERT INTO %[1]s (consumer, event_key, processed_at) SELECT %[2]s, k, now() FROM unnest(CAST(%[3]s AS text)::text[]) WITH ORDINALITY AS u(k, n)
	WHERE CASE WHEN %[4]s = '' THEN true ELSE set_config('lock_timeout', %[4]s, true) IS NOT NULL END
	AND CASE WHEN %[5]s = '' THEN true ELSE set_config('idle_in_transaction_session_timeout', %[5]s, true) IS NOT NULL END
	ORDER BY n ON CONFLICT DO NOTHING RETURNING event_key`,
	keysArg: pgTextArray,
	claimIdle: `INSERT INTO %s (consumer, event_key, processed_at) SELECT $1, $2, now()
	WHERE set_config('idle_in_transaction_session_timeout', $3, true) IS NOT NULL ON CONFLICT DO NOTHING`,
	prune:   `DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %[1]s WHERE processed_at < $1 LIMIT $2))`,
	schemas: true,
	timeArg: func(t time.Time) any { return t },
}

// sqlite stores processed_at as Unix microseconds: the driver's text format
// for time.Time does not compare in time order.
var sqliteDialect = dialect{
	table: `CREATE TABLE IF NOT EXISTS %s (
	consumer     TEXT    NOT NULL,
	event_key    TEXT    NOT NULL,
	processed_at INTEGER NOT NULL,
	PRIMARY KEY (consumer, event_key)
)`,
	claim: `INSERT INTO %s (consumer, event_key, processed_at) VALUES (?, ?, CAST(unixepoch('subsec') * 1000000 AS INTEGER)) ON CONFLICT DO NOTHING`,
	// WHERE true: without it SQLite reads ON CONFLICT as a join's ON.
	claimBatch: `INSERT INTO %s (consumer, event_key, processed_at) SELECT ?, value, CAST(unixepoch('subsec') * 1000000 AS INTEGER) FROM json_each(?) WHERE true ORDER BY key ON CONFLICT DO NOTHING RETURNING event_key`,
	keysArg:    jsonArray,
	prune:      `DELETE FROM %[1]s WHERE rowid IN (SELECT rowid FROM %[1]s WHERE processed_at < ? LIMIT ?)`,
	timeArg:    func(t time.Time) any { return t.UnixMicro() },
}

var dialects = map[string]dialect{
	"postgres": postgresDialect,
	"pgx":      postgresDialect,
	"sqlite":   sqliteDialect,
	"sqlite3":  sqliteDialect,
}

// TxOf returns the SQL transaction of tx, a unit of work an Inbox began, or
// nil for another store's: for code handed a unitofwork.Tx, as
// unitofwork.OnRecordAlone's writes are (in a handler, TxFromContext).
func TxOf(tx unitofwork.Tx) *sqlx.Tx {
	if t, ok := tx.(*sqlTx); ok {
		return t.tx
	}
	return nil
}
