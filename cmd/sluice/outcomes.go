package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/replay/ledger"

	"github.com/sluicemq/sluice/sluiceredis"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

// outcomeSchemes are the outcome-record URLs openOutcomes reads and writes.
const outcomeSchemes = "postgres:// or postgresql:// (or a key=value DSN: the outcome table), redis:// or rediss:// (sluiceredis.Outcomes)"

// checkOutcomesURL refuses a URL of the outcome records of a scheme
// openOutcomes cannot open (mysql://…: a MariaDB service's operators read
// its table there): a usage error, found before anything moves, that names
// no secret.
func checkOutcomesURL(url string) error {
	if url == "" {
		return nil
	}
	scheme, _, found := strings.Cut(url, "://")
	if !found {
		if strings.Contains(url, "=") { // lib/pq's host=… dbname=…
			return nil
		}
		return usageError{fmt.Errorf("--outcomes: not a URL (want %s)", outcomeSchemes)}
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql", "redis", "rediss":
		return nil
	}
	return usageError{fmt.Errorf("--outcomes: scheme %q is not supported: want %s", diag.Printable(scheme, 32), outcomeSchemes)}
}

// isRedis says whether url names Redis.
func isRedis(url string) bool {
	l := strings.ToLower(url)
	return strings.HasPrefix(l, "redis://") || strings.HasPrefix(l, "rediss://")
}

// openOutcomes connects to the outcome records: a PostgreSQL table
// (postgres://…, table its name), or Redis (redis://, rediss://…, table the
// key prefix without its colon: sluiceredis.Outcomes). With create the table is
// created when it is missing (a command that starts a run); without it (the
// read-only report, resolve, which records into an existing run) a missing
// table is an error naming it. A URL of the wrong form is a usage error.
// Errors never carry the URL's password.
func openOutcomes(ctx context.Context, url, table string, create bool) (ledger.Ledger, func(), error) {
	if err := checkOutcomesURL(url); err != nil {
		return nil, nil, err
	}
	if isRedis(url) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, usageError{errors.New("--outcomes: " + diag.RedactError(err).Error())}
		}
		redis.SetLogger(quietRedis{}) // its pool's retries would print lines of their own; the error says it
		opts.MaxRetries = 1
		client := redis.NewClient(opts)
		if err := client.Ping(ctx).Err(); err != nil {
			_ = client.Close()
			return nil, nil, fmt.Errorf("--outcomes: %w", diag.RedactError(err))
		}
		s, err := sluiceredis.NewOutcomes(client, sluiceredis.OutcomesConfig{Prefix: table + ":"})
		if err != nil {
			_ = client.Close()
			return nil, nil, fmt.Errorf("--outcomes: %w", err)
		}
		return s, func() { _ = client.Close() }, nil
	}
	db, err := openPostgres(ctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("--outcomes: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // connected: a statement's bound
	defer cancel()
	s, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{Table: table})
	if err == nil {
		if create {
			err = s.CreateTable(ctx)
		} else {
			err = tableExists(ctx, db, table)
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("--outcomes: %w", err)
	}
	return s, func() { _ = db.Close() }, nil
}

// connectTimeout bounds the start-up of each connection the CLI opens to
// PostgreSQL (the URL's connect_timeout wins, up to connectTimeout + 5 s for
// the first connection, openPostgres's bound): an operator's command waits
// for a database on a busy host longer than a consumer's pool does
// (sluicesql/postgres's 5 s, which keeps a stalled start-up from holding
// deliveries), and still never for ever.
const connectTimeout = 30 * time.Second

// openPostgres opens a pool on the PostgreSQL database at url (a
// postgres:// URL or a key=value DSN) whose every wait is bounded
// (sluicesql/postgres.Open): connecting within connectTimeout, a call
// given up CancelGrace after its context ended. A pool of lib/pq's alone
// waits on a silent database — black-holed: the connection up, nothing
// coming back — for ever, its start-up and its cancel request included.
// It connects before it returns (within ctx — Ctrl-C, where the command
// catches it — and connectTimeout + 5 s), so a
// command's first call, bounded for a statement, does not bear a slow
// start-up, and a database that does not answer is named at once. The
// outcome records, the archive and restore tables, the outbox and the
// console's outbox are opened with it: the CLI links the driver, package
// dlq does not. Its errors carry no password.
func openPostgres(ctx context.Context, url string) (*sqlx.DB, error) {
	db, err := postgres.Open(postgres.Config{DSN: url, ConnectTimeout: connectTimeout})
	if err != nil {
		return nil, diag.RedactError(err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout+5*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		_ = db.Close()
		if ctx.Err() != nil { // interrupted: said as such, not as the database's silence
			return nil, fmt.Errorf("connecting to the database: %w", ctx.Err())
		}
		return nil, fmt.Errorf("connecting to the database (within its connect_timeout, default %s): %w", connectTimeout, diag.RedactError(err))
	}
	return db, nil
}

// tableExists returns an error naming table when the database has no such
// table (to_regclass: the name as the store uses it, on the search path
// unless schema-qualified).
func tableExists(ctx context.Context, db *sqlx.DB, table string) error {
	var found bool
	if err := db.GetContext(ctx, &found, `SELECT to_regclass($1) IS NOT NULL`, table); err != nil {
		return fmt.Errorf("looking for the outcome table %s: %w", diag.Printable(table, 128), diag.RedactError(err))
	}
	if !found {
		return fmt.Errorf("no outcome table %s in that database (check --outcomes-table and --outcomes: the table the consumers' replay stage records into; nothing was created)", diag.Printable(table, 128))
	}
	return nil
}

// tablesExist reports whether every table (a name, or schema.name, each
// part an SQL identifier, as the stores quote them: case matters) is in
// db, a PostgreSQL database.
func tablesExist(ctx context.Context, db *sqlx.DB, tables ...string) (bool, error) {
	for _, table := range tables {
		parts := strings.Split(table, ".")
		for i, p := range parts {
			parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
		}
		var found bool
		if err := db.GetContext(ctx, &found, `SELECT to_regclass($1) IS NOT NULL`, strings.Join(parts, ".")); err != nil || !found {
			return false, err
		}
	}
	return true, nil
}

// quietRedis drops go-redis's own log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// outcomesPlace names where the records are, for a message: "table T",
// "key prefix P:".
func outcomesPlace(url, table string) string {
	if isRedis(url) {
		return "key prefix " + diag.Printable(table, 128) + ":"
	}
	return "table " + diag.Printable(table, 128)
}
