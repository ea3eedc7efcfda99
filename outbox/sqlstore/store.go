// Package sqlstore is the outbox's store on PostgreSQL (lib/pq or pgx) and
// SQLite: produced messages are rows of an outbox table, written in the
// inbox's transaction (Publish) or in a transaction of your own (Write),
// and read, deleted and marked by outbox.Relay. It imports no database
// driver.
package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metadatacodec"
	"github.com/sluicemq/sluice/internal/sqldb"
	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/internal/sqltx"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/unitofwork"
)

// Defaults.
const (
	// TableDefault is the default outbox table name.
	TableDefault = "sluice_outbox"
	// leaseDefault is Config.Lease's default.
	leaseDefault = 2 * time.Minute
	// topicMaxLength bounds a row's topic, in bytes.
	topicMaxLength = 255
)

// Config configures a Store.
type Config struct {
	// DB is the database of the business writes, the inbox's. Its driver
	// picks the dialect: "postgres" or "pgx" for PostgreSQL, "sqlite" or
	// "sqlite3" for SQLite. Exactly one of DB and SQLDB is required.
	DB *sqlx.DB
	// SQLDB is the database as a plain *sql.DB (see
	// sluicesql.InboxConfig.SQLDB), with DriverName when its
	// driver's type does not tell the dialect.
	SQLDB      *sql.DB
	DriverName string
	// Table is the outbox table: a name, or schema.name on PostgreSQL, each
	// part an SQL identifier. Quoted, so case matters. Default TableDefault.
	Table string
	// Lease is how long a relay on SQLite holds a batch it took: another
	// relay takes its rows after that, should it have stopped. Keep it
	// longer than the relay's PublishTimeout plus twice its StoreTimeout.
	// On PostgreSQL a batch is held by its transaction's row locks, released
	// the moment its relay's connection ends. Default 2 min.
	Lease time.Duration
	// Propagator writes the trace context of the delivery being handled (or
	// of ctx in Write) into each message's metadata when it has none, so a
	// produced message continues the trace of the delivery that produced
	// it, as middleware.TracingPublisher does. Default W3C trace context
	// and baggage, as middleware.TraceConfig's.
	Propagator propagation.TextMapPropagator
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

// Store is the outbox table. It is an outbox.Writer (Publish, in the
// inbox's transaction) and an outbox.Store (for outbox.Relay). It is safe
// for concurrent use.
type Store struct {
	db      *sqlx.DB
	dialect dialect
	table   string // quoted
	name    string // as configured, unquoted
	last    string // last part, unquoted
	lease   time.Duration
	wake    chan struct{}
	prop    propagation.TextMapPropagator
	check   broker.PublishChecker
}

var (
	_ outbox.Writer       = (*Store)(nil)
	_ outbox.InboxChecker = (*Store)(nil)
	_ outbox.Store        = (*Store)(nil)
	_ outbox.Waker        = (*Store)(nil)
)

// New validates cfg and returns a Store. It does not touch the database;
// call CreateTable or apply SchemaSQL first.
func New(cfg Config) (*Store, error) {
	cfg.Table = cmp.Or(cfg.Table, TableDefault)
	cfg.Lease = cmp.Or(cfg.Lease, leaseDefault)
	if cfg.Lease < 0 {
		return nil, fmt.Errorf("outbox/sqlstore: Config.Lease must not be negative, got %s", cfg.Lease)
	}
	db, err := sqldb.Open("outbox/sqlstore: Config", cfg.DB, cfg.SQLDB, cfg.DriverName)
	if err != nil {
		return nil, err
	}
	d, ok := dialects[db.DriverName()]
	if !ok {
		return nil, fmt.Errorf("outbox/sqlstore: Config.DB: driver %q is not supported (want postgres, pgx, sqlite or sqlite3)", db.DriverName())
	}
	quoted, last, err := sqlname.Quote(cfg.Table, d.schemas)
	if err != nil {
		return nil, fmt.Errorf("outbox/sqlstore: Config.Table: %w", err)
	}
	prop := cmp.Or[propagation.TextMapPropagator](cfg.Propagator, propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Store{db: db, dialect: d, table: quoted, name: cfg.Table, last: last, lease: cfg.Lease, wake: make(chan struct{}, 1), prop: prop, check: cfg.Checker}, nil
}

// Name is the table's name as configured: the relay's metrics label.
func (s *Store) Name() string { return s.name }

// SchemaSQL returns the statements that create the outbox table and its
// index, as CreateTable runs them (on PostgreSQL, with the statement that
// adds dead_at to a table of an earlier version).
func (s *Store) SchemaSQL() string {
	stmts := s.schema()
	if s.dialect.addDead != "" {
		stmts = append(stmts, fmt.Sprintf(s.dialect.addDead, s.table))
	}
	return strings.Join(stmts, ";\n") + ";\n"
}

func (s *Store) schema() []string {
	return []string{
		fmt.Sprintf(s.dialect.table, s.table),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (next_attempt_at)`, `"`+sqlname.Index(s.last, "_next_attempt", "nat")+`"`, s.table),
	}
}

// CreateTable creates the outbox table and its index if they do not exist,
// and migrates a table of an earlier version (adds its dead_at column).
func (s *Store) CreateTable(ctx context.Context) error {
	for _, stmt := range s.schema() {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("outbox/sqlstore: creating outbox table %s: %w", s.table, err)
		}
	}
	if err := s.migrateDead(ctx); err != nil {
		return fmt.Errorf("outbox/sqlstore: adding dead_at to %s: %w", s.table, err)
	}
	return nil
}

// migrateDead adds the dead_at column to a table created before it.
func (s *Store) migrateDead(ctx context.Context) error {
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

// Exists reports whether the outbox table exists (the operator's commands
// create nothing).
func (s *Store) Exists(ctx context.Context) (bool, error) {
	var found bool
	if err := s.db.GetContext(ctx, &found, s.dialect.exists, s.dialect.existsArg(s)); err != nil {
		return false, fmt.Errorf("outbox/sqlstore: looking for %s: %w", s.table, err)
	}
	return found, nil
}

// Wakeups signals rows committed through Publish in this process (and
// Wake): the relay of this store publishes them without waiting for its
// poll.
func (s *Store) Wakeups() <-chan struct{} { return s.wake }

// Wake signals the relay that rows were committed: call it after
// committing a transaction Write wrote in.
func (s *Store) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Publish writes msgs, to be published to topic, in the inbox's SQL
// transaction that ctx carries (sluicesql.TxFromContext), as
// outbox.Writer says: they commit with the claim and the business writes.
// The outbox table must be in the inbox's database. It wakes the store's
// relay once the transaction commits.
func (s *Store) Publish(ctx context.Context, topic string, msgs ...*message.Message) error {
	tx := sqltx.FromContext(ctx)
	if tx == nil {
		return fmt.Errorf("%w: ctx carries no SQL inbox transaction (Publish runs inside the inbox stage with a sluicesql.Inbox; elsewhere, Write in a transaction of your own)", outbox.ErrNoUnitOfWork)
	}
	if !s.speaks(tx.DriverName()) {
		return fmt.Errorf("%w: the inbox's transaction is on %s, the outbox on %s", outbox.ErrNoUnitOfWork, tx.DriverName(), s.db.DriverName())
	}
	rows, err := s.rows(ctx, topic, msgs)
	if err != nil {
		return err
	}
	err = s.insert(ctx, tx, rows)
	switch {
	case err == nil, sqltx.Aborted(err):
		// Written, or refused because the handler's own statement aborted
		// the transaction: either way, a rejection's claim recorded alone
		// carries these rows too.
		unitofwork.OnRecordAlone(ctx, func(ctx context.Context, u unitofwork.Tx) error {
			t := sqltx.Of(u)
			if t == nil {
				return fmt.Errorf("outbox/sqlstore: the unit of work is not an SQL transaction")
			}
			return s.insert(ctx, t, rows)
		})
		unitofwork.OnCommit(ctx, s.Wake)
	}
	if err != nil && sqltx.Aborted(err) {
		return fmt.Errorf("%w: outbox/sqlstore: writing %d messages to %s: %w", unitofwork.ErrAborted, len(msgs), s.table, err)
	}
	if err != nil {
		return fmt.Errorf("outbox/sqlstore: writing %d messages to %s: %w", len(msgs), s.table, err)
	}
	return nil
}

// speaks reports whether a database of driver driverName is of the
// store's dialect.
func (s *Store) speaks(driverName string) bool { return dialects[driverName].name == s.dialect.name }

// CheckInbox reports whether Publish can write in store's units of work:
// an SQL inbox (sluicesql.Inbox) of the same dialect
// (outbox.InboxChecker). Both tables must also be in one database, which
// it cannot see: give both stores the same DB.
func (s *Store) CheckInbox(store deduplication.Store) error {
	driver, ok := sqltx.InboxDriver(store)
	if !ok {
		return fmt.Errorf("%w: the inbox's store is a %T, whose units of work are no SQL transactions: the outbox on SQL needs sluicesql.Inbox", outbox.ErrNoUnitOfWork, store)
	}
	if !s.speaks(driver) {
		return fmt.Errorf("%w: the inbox is on %s, the outbox on %s", outbox.ErrNoUnitOfWork, driver, s.db.DriverName())
	}
	return nil
}

// Execer is a transaction (or a database) Write writes in: *sql.Tx,
// *sqlx.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Write writes msgs, to be published to topic, in tx — a transaction of
// your own on the outbox's database, for a service that produces outside a
// consumer (an HTTP handler writing an order and its event): they commit
// with it. The topic is 1 to 255 bytes. Call Wake after the commit, or the
// relay finds them within its PollInterval. Each message gets its ids as
// Publish gives them.
func (s *Store) Write(ctx context.Context, tx Execer, topic string, msgs ...*message.Message) error {
	rows, err := s.rows(ctx, topic, msgs)
	if err != nil {
		return err
	}
	if err := s.insert(ctx, tx, rows); err != nil {
		return fmt.Errorf("outbox/sqlstore: writing %d messages to %s: %w", len(msgs), s.table, err)
	}
	return nil
}

// row is a message encoded for its INSERT.
type row struct {
	topic, id         string
	metadata, payload []byte
}

func encodeMetadata(md message.Metadata) []byte { return metadatacodec.Encode(md) }

func decodeMetadata(b []byte) (message.Metadata, error) {
	md, err := metadatacodec.Decode(b)
	return message.Metadata(md), err
}

// rows gives each message its ids and ctx's trace context, and encodes it.
func (s *Store) rows(ctx context.Context, topic string, msgs []*message.Message) ([]row, error) {
	traced := trace.SpanContextFromContext(ctx).IsValid()
	if topic == "" || len(topic) > topicMaxLength {
		return nil, fmt.Errorf("outbox/sqlstore: topic must be 1 to %d bytes, got %d", topicMaxLength, len(topic))
	}
	out := make([]row, len(msgs))
	for i, m := range msgs {
		if m == nil {
			return nil, fmt.Errorf("outbox/sqlstore: message %d is nil", i)
		}
		if m.UUID == "" {
			m.UUID = watermill.NewUUID()
		}
		if m.Metadata == nil {
			m.Metadata = message.Metadata{}
		}
		ownHistory(ctx, m)
		if m.Metadata.Get(sluice.EventIDKey) == "" {
			m.Metadata.Set(sluice.EventIDKey, m.UUID)
		}
		if traced && !slices.ContainsFunc(s.prop.Fields(), func(f string) bool { return m.Metadata.Get(f) != "" }) {
			s.prop.Inject(ctx, propagation.MapCarrier(m.Metadata)) // the producer's own trace context wins
		}
		if err := s.checkPublish(topic, i, m); err != nil {
			return nil, err
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		out[i] = row{topic: topic, id: m.UUID, metadata: encodeMetadata(m.Metadata), payload: payload}
	}
	return out, nil
}

// insertChunk bounds the rows of one INSERT statement.
const insertChunk = 100

func (s *Store) insert(ctx context.Context, tx Execer, rows []row) error {
	for len(rows) > 0 {
		n := min(len(rows), insertChunk)
		var q strings.Builder
		q.WriteString(`INSERT INTO ` + s.table + ` (topic, message_id, metadata, payload, created_at, next_attempt_at) VALUES `)
		args := make([]any, 0, 4*n)
		for i, r := range rows[:n] {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString(s.dialect.values(len(args)))
			args = append(args, r.topic, r.id, r.metadata, r.payload)
		}
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// Due takes up to limit due rows, oldest first (outbox.Store). On
// PostgreSQL it holds them with FOR UPDATE SKIP LOCKED in a transaction
// that lives until the batch is finished or released, or ctx ends; on
// SQLite it leases them for Lease.
func (s *Store) Due(ctx context.Context, limit int) (outbox.Batch, error) {
	return s.DueWithin(ctx, limit, 0)
}

// DueWithin is Due with the rows bounded by maxBytes of payload and
// metadata too, after the first (outbox.BytesBounder); 0: no bound. The
// rows' sizes are read first, their contents only for the rows taken.
func (s *Store) DueWithin(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	if s.dialect.name == "postgres" {
		return s.duePostgres(ctx, limit, maxBytes)
	}
	return s.dueSQLite(ctx, limit, maxBytes)
}

// sized is a due row's id and bytes.
type sized struct {
	ID    int64 `db:"id"`
	Bytes int64 `db:"bytes"`
}

// within returns the ids of rows up to maxBytes (at least one).
func within(rs []sized, maxBytes int64) []int64 {
	ids := make([]int64, 0, len(rs))
	var total int64
	for _, r := range rs {
		total += r.Bytes
		if len(ids) > 0 && maxBytes > 0 && total > maxBytes {
			break
		}
		ids = append(ids, r.ID)
	}
	return ids
}

// scanned is a row as selected.
type scanned struct {
	ID        int64    `db:"id"`
	Topic     string   `db:"topic"`
	MessageID string   `db:"message_id"`
	Metadata  []byte   `db:"metadata"`
	Payload   []byte   `db:"payload"`
	Attempts  int      `db:"attempts"`
	Created   any      `db:"created_at"`
	Age       *float64 `db:"age"` // seconds, on the database's clock (PostgreSQL)
}

// decode reads the rows back; one that cannot be (its metadata altered by
// hand, say) carries its Err, for the relay to keep aside: it never stops
// the rest.
func (s *Store) decode(rs []scanned) []outbox.Row {
	out := make([]outbox.Row, 0, len(rs))
	for _, r := range rs {
		row := outbox.Row{ID: r.ID, Topic: r.Topic, Attempts: r.Attempts}
		md, err := decodeMetadata(r.Metadata)
		if err != nil {
			row.Err = fmt.Errorf("outbox/sqlstore: row %d of %s: its metadata: %w", r.ID, s.table, err)
		}
		row.Message = message.NewMessage(r.MessageID, r.Payload)
		row.Message.Metadata = md
		row.CreatedAt, err = s.dialect.readTime(r.Created)
		if err != nil && row.Err == nil {
			row.Err = fmt.Errorf("outbox/sqlstore: row %d of %s: %w", r.ID, s.table, err)
		}
		row.Age = age(r.Age, row.CreatedAt)
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b outbox.Row) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

const columns = `id, topic, message_id, metadata, payload, attempts, created_at`

// age is seconds read on the database's clock, or, on SQLite (whose clock
// is the process's), the time since created.
func age(seconds *float64, created time.Time) time.Duration {
	if seconds != nil {
		return max(time.Duration(*seconds*float64(time.Second)), 0)
	}
	if created.IsZero() {
		return 0
	}
	return max(time.Since(created), 0)
}

// The bounds of a batch's hold on PostgreSQL when Due's context has no
// deadline (the relay's always has one), and at least.
const (
	holdMax = 5 * time.Minute
	holdMin = time.Second
)

func (s *Store) duePostgres(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outbox/sqlstore: begin: %w", err)
	}
	// The transaction is idle while the batch is published: a server-wide
	// idle_in_transaction_session_timeout shorter than the publishes would
	// end it after them, and the rows would be sent again and again. Nor is
	// it turned off: a relay that hangs (stopped, its link stalled) would
	// hold the rows from every other relay for as long as it hangs. The
	// batch's life (ctx's deadline: the relay's PublishTimeout and
	// StoreTimeouts) bounds both the idle time and each statement.
	hold := holdMax
	if d, ok := ctx.Deadline(); ok {
		hold = min(max(time.Until(d), holdMin), holdMax)
	}
	for _, name := range []string{"idle_in_transaction_session_timeout", "statement_timeout"} {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL %s = %d`, name, hold.Milliseconds())); err != nil {
			_ = tx.Rollback()
			return nil, fmt.Errorf("outbox/sqlstore: %w", err)
		}
	}
	// The sizes first: the rows locked beyond maxBytes are left untouched
	// and released with the batch.
	var sizes []sized
	q := `SELECT id, octet_length(payload) + octet_length(metadata) AS bytes FROM ` + s.table +
		` WHERE dead_at IS NULL AND next_attempt_at <= clock_timestamp() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	if err := tx.SelectContext(ctx, &sizes, q, limit); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("outbox/sqlstore: reading due rows of %s: %w", s.table, err)
	}
	var rs []scanned
	ids := within(sizes, maxBytes)
	if len(ids) > 0 {
		q, args, err := sqlx.In(`SELECT `+columns+`, EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8 AS age FROM `+s.table+` WHERE id IN (?)`, ids)
		if err == nil {
			err = tx.SelectContext(ctx, &rs, tx.Rebind(q), args...)
		}
		if err != nil {
			_ = tx.Rollback()
			return nil, fmt.Errorf("outbox/sqlstore: reading due rows of %s: %w", s.table, err)
		}
	}
	return &pgBatch{s: s, tx: tx, rows: s.decode(rs), cut: len(ids) < len(sizes)}, nil
}

type pgBatch struct {
	s    *Store
	tx   *sqlx.Tx
	rows []outbox.Row
	cut  bool // maxBytes left due rows out
}

func (b *pgBatch) Rows() []outbox.Row { return b.rows }

func (b *pgBatch) CutShort() bool { return b.cut }

func (b *pgBatch) Finish(ctx context.Context, relayed []int64, failed []outbox.Failed) error {
	if err := b.s.finish(ctx, b.tx, relayed, failed); err != nil {
		_ = b.tx.Rollback()
		return err
	}
	if err := b.tx.Commit(); err != nil {
		return fmt.Errorf("outbox/sqlstore: commit: %w", err)
	}
	return nil
}

func (b *pgBatch) Release(context.Context) error {
	if err := b.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// finish deletes the relayed rows and records the failed ones in db.
func (s *Store) finish(ctx context.Context, db sqlx.ExtContext, relayed []int64, failed []outbox.Failed) error {
	for chunk := range slices.Chunk(relayed, 1000) {
		q, args, err := sqlx.In(`DELETE FROM `+s.table+` WHERE id IN (?)`, chunk)
		if err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, db.Rebind(q), args...); err != nil {
			return fmt.Errorf("outbox/sqlstore: deleting %d relayed rows of %s: %w", len(chunk), s.table, err)
		}
	}
	// The wait, not the relay's clock: Due compares with the database's.
	q := db.Rebind(`UPDATE ` + s.table + ` SET attempts = attempts + 1, last_error = ?, next_attempt_at = ` + s.dialect.after + s.dialect.unlease + ` WHERE id = ?`)
	dead := db.Rebind(`UPDATE ` + s.table + ` SET attempts = attempts + 1, last_error = ?, dead_at = ` + s.dialect.now + s.dialect.unlease + ` WHERE id = ?`)
	for _, f := range failed {
		var err error
		if f.Dead {
			_, err = db.ExecContext(ctx, dead, f.Err, f.ID)
		} else {
			_, err = db.ExecContext(ctx, q, f.Err, s.dialect.waitArg(max(time.Until(f.NextAttempt), 0)), f.ID)
		}
		if err != nil {
			return fmt.Errorf("outbox/sqlstore: recording the failure of row %d of %s: %w", f.ID, s.table, err)
		}
	}
	return nil
}

func (s *Store) dueSQLite(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	now := time.Now()
	var sizes []sized
	q := `SELECT id, length(CAST(payload AS BLOB)) + length(CAST(metadata AS BLOB)) AS bytes FROM ` + s.table +
		` WHERE dead_at IS NULL AND next_attempt_at <= ? AND leased_until <= ? ORDER BY id LIMIT ?`
	if err := s.db.SelectContext(ctx, &sizes, q, now.UnixMicro(), now.UnixMicro(), limit); err != nil {
		return nil, fmt.Errorf("outbox/sqlstore: leasing due rows of %s: %w", s.table, err)
	}
	var rs []scanned
	ids := within(sizes, maxBytes)
	if len(ids) > 0 {
		// Taken only if still due and free: another relay may have leased
		// them since.
		q, args, err := sqlx.In(`UPDATE `+s.table+` SET leased_until = ? WHERE id IN (?) AND dead_at IS NULL AND next_attempt_at <= ? AND leased_until <= ? RETURNING `+columns,
			now.Add(s.lease).UnixMicro(), ids, now.UnixMicro(), now.UnixMicro())
		if err == nil {
			err = s.db.SelectContext(ctx, &rs, q, args...)
		}
		if err != nil {
			return nil, fmt.Errorf("outbox/sqlstore: leasing due rows of %s: %w", s.table, err)
		}
	}
	return &leaseBatch{s: s, rows: s.decode(rs), cut: len(ids) < len(sizes)}, nil
}

type leaseBatch struct {
	s    *Store
	rows []outbox.Row
	cut  bool // maxBytes left due rows out
}

func (b *leaseBatch) Rows() []outbox.Row { return b.rows }

func (b *leaseBatch) CutShort() bool { return b.cut }

func (b *leaseBatch) Finish(ctx context.Context, relayed []int64, failed []outbox.Failed) error {
	tx, err := b.s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox/sqlstore: begin: %w", err)
	}
	if err := b.s.finish(ctx, tx, relayed, failed); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (b *leaseBatch) Release(ctx context.Context) error {
	if len(b.rows) == 0 {
		return nil
	}
	ids := make([]int64, len(b.rows))
	for i, r := range b.rows {
		ids[i] = r.ID
	}
	q, args, err := sqlx.In(`UPDATE `+b.s.table+` SET leased_until = 0 WHERE id IN (?)`, ids)
	if err != nil {
		return err
	}
	_, err = b.s.db.ExecContext(ctx, q, args...)
	return err
}

// Stats counts what waits in the outbox (outbox.Store).
func (s *Store) Stats(ctx context.Context) (outbox.Stats, error) {
	var r struct {
		Pending int64    `db:"pending"`
		Failing int64    `db:"failing"`
		Dead    int64    `db:"dead"`
		Oldest  any      `db:"oldest"`
		Age     *float64 `db:"age"`
	}
	q := `SELECT coalesce(sum(CASE WHEN dead_at IS NULL THEN 1 ELSE 0 END), 0) AS pending,
	coalesce(sum(CASE WHEN dead_at IS NULL AND attempts > 0 THEN 1 ELSE 0 END), 0) AS failing,
	coalesce(sum(CASE WHEN dead_at IS NULL THEN 0 ELSE 1 END), 0) AS dead,
	min(CASE WHEN dead_at IS NULL THEN created_at END) AS oldest` + s.dialect.oldestAge + ` FROM ` + s.table
	if err := s.db.GetContext(ctx, &r, q); err != nil {
		return outbox.Stats{}, fmt.Errorf("outbox/sqlstore: counting %s: %w", s.table, err)
	}
	st := outbox.Stats{Pending: r.Pending, Failing: r.Failing, Dead: r.Dead}
	if r.Oldest != nil {
		t, err := s.dialect.readTime(r.Oldest)
		if err != nil {
			return outbox.Stats{}, err
		}
		st.Oldest = t
		st.OldestAge = age(r.Age, t)
	}
	return st, nil
}

// Entry is a row as an operator sees it (List).
type Entry struct {
	ID        int64
	Topic     string
	MessageID string
	EventID   string
	Attempts  int
	// LastError is the last publish's error, redacted (a URL's password,
	// a token) as it is read: the table may hold one written before.
	LastError   string
	CreatedAt   time.Time
	NextAttempt time.Time
	// DeadAt is when the relay set the row aside as dead; zero while it is
	// still tried.
	DeadAt time.Time
}

// Which selects the rows List returns.
type Which int

// The rows List returns.
const (
	// All rows, dead ones included.
	All Which = iota
	// Failing rows: whose last publish failed, still tried.
	Failing
	// Dead rows: set aside by the relay after its MaxAttempts, waiting for
	// an operator's Requeue or Discard.
	Dead
)

// List returns up to limit rows of which, oldest first.
func (s *Store) List(ctx context.Context, which Which, limit int) ([]Entry, error) {
	var rs []struct {
		ID        int64          `db:"id"`
		Topic     string         `db:"topic"`
		MessageID string         `db:"message_id"`
		Metadata  []byte         `db:"metadata"`
		Attempts  int            `db:"attempts"`
		LastError sql.NullString `db:"last_error"`
		Created   any            `db:"created_at"`
		Next      any            `db:"next_attempt_at"`
		Dead      any            `db:"dead_at"`
	}
	where := ""
	switch which {
	case Failing:
		where = ` WHERE attempts > 0 AND dead_at IS NULL`
	case Dead:
		where = ` WHERE dead_at IS NOT NULL`
	}
	q := s.db.Rebind(`SELECT id, topic, message_id, metadata, attempts, last_error, created_at, next_attempt_at, dead_at FROM ` + s.table + where + ` ORDER BY id LIMIT ?`)
	if err := s.db.SelectContext(ctx, &rs, q, limit); err != nil {
		return nil, fmt.Errorf("outbox/sqlstore: listing %s: %w", s.table, err)
	}
	out := make([]Entry, 0, len(rs))
	for _, r := range rs {
		md, _ := decodeMetadata(r.Metadata) // an unreadable one is shown without its event id
		created, err := s.dialect.readTime(r.Created)
		if err != nil {
			return nil, err
		}
		next, err := s.dialect.readTime(r.Next)
		if err != nil {
			return nil, err
		}
		e := Entry{ID: r.ID, Topic: r.Topic, MessageID: r.MessageID, EventID: md[sluice.EventIDKey],
			Attempts: r.Attempts, LastError: diag.Redact(r.LastError.String), CreatedAt: created, NextAttempt: next}
		if r.Dead != nil {
			if e.DeadAt, err = s.dialect.readTime(r.Dead); err != nil {
				return nil, err
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// RetryNow makes every failing row due at once (after the cause is fixed:
// a queue declared, a binding added) and returns how many it touched.
func (s *Store) RetryNow(ctx context.Context) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.db.Rebind(`UPDATE `+s.table+` SET next_attempt_at = `+s.dialect.after+` WHERE attempts > 0 AND dead_at IS NULL`), s.dialect.waitArg(0))
	if err != nil {
		return 0, fmt.Errorf("outbox/sqlstore: %w", err)
	}
	s.Wake()
	return res.RowsAffected()
}

// dialect holds the SQL that differs between databases.
type dialect struct {
	name    string
	table   string // %s is the table
	schemas bool
	// values returns one row's placeholders for INSERT, the first
	// argument being number n+1.
	values  func(n int) string
	unlease string
	// now is the time now, on the clock Due compares with.
	now string
	// oldestAge selects the oldest pending row's age as age, in seconds,
	// on the database's clock; empty where that is the process's.
	oldestAge string
	// addDead adds dead_at to a table created before it (%s is the
	// table); empty on SQLite, which cannot say IF NOT EXISTS.
	addDead string
	// after is the time a wait (waitArg's argument) from now, on the
	// clock Due compares with.
	after   string
	waitArg func(time.Duration) any
	// exists reads whether the table exists, with existsArg's argument.
	exists    string
	existsArg func(s *Store) any
	readTime  func(any) (time.Time, error)
}

var postgres = dialect{
	name: "postgres",
	table: `CREATE TABLE IF NOT EXISTS %s (
	id              BIGSERIAL   PRIMARY KEY,
	topic           TEXT        NOT NULL,
	message_id      TEXT        NOT NULL,
	metadata        BYTEA       NOT NULL,
	payload         BYTEA       NOT NULL,
	created_at      TIMESTAMPTZ NOT NULL,
	attempts        INTEGER     NOT NULL DEFAULT 0,
	next_attempt_at TIMESTAMPTZ NOT NULL,
	last_error      TEXT,
	dead_at         TIMESTAMPTZ
)`,
	schemas: true,
	values: func(n int) string {
		return fmt.Sprintf("($%d, $%d, $%d, $%d, clock_timestamp(), clock_timestamp())", n+1, n+2, n+3, n+4)
	},
	after:     `clock_timestamp() + make_interval(secs => ?)`,
	now:       `clock_timestamp()`,
	oldestAge: `, EXTRACT(EPOCH FROM clock_timestamp() - min(CASE WHEN dead_at IS NULL THEN created_at END))::float8 AS age`,
	addDead:   `ALTER TABLE %s ADD COLUMN IF NOT EXISTS dead_at TIMESTAMPTZ`,
	// The quoted name, as the store's statements name it (case matters).
	exists:    `SELECT to_regclass($1) IS NOT NULL`,
	existsArg: func(s *Store) any { return s.table },
	waitArg:   func(d time.Duration) any { return d.Seconds() },
	readTime: func(v any) (time.Time, error) {
		t, ok := v.(time.Time)
		if !ok {
			return time.Time{}, fmt.Errorf("outbox/sqlstore: a time column read as %T", v)
		}
		return t, nil
	},
}

// sqlite keeps times as Unix microseconds, as the inbox does.
var sqlite = dialect{
	name: "sqlite",
	table: `CREATE TABLE IF NOT EXISTS %s (
	id              INTEGER PRIMARY KEY AUTOINCREMENT,
	topic           TEXT    NOT NULL,
	message_id      TEXT    NOT NULL,
	metadata        BLOB    NOT NULL,
	payload         BLOB    NOT NULL,
	created_at      INTEGER NOT NULL,
	attempts        INTEGER NOT NULL DEFAULT 0,
	next_attempt_at INTEGER NOT NULL,
	last_error      TEXT,
	leased_until    INTEGER NOT NULL DEFAULT 0,
	dead_at         INTEGER
)`,
	values: func(int) string {
		return "(?, ?, ?, ?, CAST(unixepoch('subsec') * 1000000 AS INTEGER), CAST(unixepoch('subsec') * 1000000 AS INTEGER))"
	},
	unlease:   `, leased_until = 0`,
	after:     `?`, // Due compares with the relay's clock on SQLite
	now:       `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`,
	exists:    `SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?`,
	existsArg: func(s *Store) any { return s.last },
	waitArg:   func(d time.Duration) any { return time.Now().Add(d).UnixMicro() },
	readTime: func(v any) (time.Time, error) {
		us, ok := v.(int64)
		if !ok {
			return time.Time{}, fmt.Errorf("outbox/sqlstore: a time column read as %T", v)
		}
		return time.UnixMicro(us), nil
	},
}

var dialects = map[string]dialect{
	"postgres": postgres,
	"pgx":      postgres,
	"sqlite":   sqlite,
	"sqlite3":  sqlite,
}
