// Package testenv connects tests to the real services on 127.0.0.1 and
// isolates each test: its own PostgreSQL schema, its own Redis key prefix,
// its own names, all removed when the test ends.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the PostgreSQL driver
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/localenv"
)

// Service addresses, overridable by environment variables.
var (
	PostgresURL = localenv.Get("SLUICE_TEST_POSTGRES_URL", localenv.PostgresURL)
	RedisAddr   = localenv.Get("SLUICE_TEST_REDIS_ADDR", localenv.RedisAddr)
	AMQPURL     = localenv.Get("SLUICE_TEST_AMQP_URL", localenv.AMQPURL)
)

// Name returns prefix followed by a random suffix: a unique lower-case SQL
// identifier, queue name or key prefix.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// Postgres opens the test database; the pool is closed when t ends. A test
// fails, not skips, when PostgreSQL is not reachable: `make services`
// provides it.
func Postgres(t testing.TB) *sqlx.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sqlx.ConnectContext(ctx, "postgres", PostgresURL)
	require.NoError(t, err, "PostgreSQL at %s (run `make services`)", redact(PostgresURL))
	KeepIdle(db.DB)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// KeepIdle has db keep the connections a test's deliveries in flight
// opened, for a while, as postgres.Open's pool does: database/sql keeps 2,
// so each transaction past the second opened a connection and closed it —
// a fork of a server process, 30 ms of CPU on the test machine
// (docs/reliability.md).
func KeepIdle(db *sql.DB) {
	db.SetMaxIdleConns(idleConns)
	db.SetConnMaxIdleTime(idleTime)
}

// A test pool's idle connections: at most idleConns, each closed once it
// has been idle idleTime, so that a test's pool holds few of PostgreSQL's
// max_connections (300) between its bursts.
const (
	idleConns = 16
	idleTime  = 5 * time.Second
)

// Schema creates a schema of its own for t in db and drops it, with
// everything in it, when t ends.
func Schema(t testing.TB, db *sqlx.DB) string {
	t.Helper()
	name := Name("t")
	_, err := db.ExecContext(context.Background(), "CREATE SCHEMA "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), "DROP SCHEMA "+name+" CASCADE")
		if err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return name
}

// PostgresInSchema opens the test database with a search_path of a schema
// of t's own (Schema), so that code written for the default schema — a
// README's — runs isolated; the pool is closed and the schema dropped when
// t ends.
func PostgresInSchema(t testing.TB) *sqlx.DB {
	t.Helper()
	schema := Schema(t, Postgres(t))
	sep := "?"
	if strings.Contains(PostgresURL, "?") {
		sep = "&"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sqlx.ConnectContext(ctx, "postgres", PostgresURL+sep+"search_path="+schema)
	require.NoError(t, err, "PostgreSQL at %s (run `make services`)", redact(PostgresURL))
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Redis returns a client and a key prefix of t's own; the keys under the
// prefix are deleted and the client closed when t ends.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: RedisAddr})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.Ping(ctx).Err(), "Redis at %s (run `make services`)", RedisAddr)
	prefix := Name("sluicetest") + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = c.Del(ctx, iter.Val()).Err()
		}
		_ = c.Close()
	})
	return c, prefix
}

// redact hides the password of a URL for messages.
func redact(u string) string { return diag.RedactURL(u) }

// ClaimDir records in dir, a private node's, server's or browser's
// directory, the process that made it (owner.pid): make test's first step
// (scripts/sweep.sh) stops the processes a killed run left in such a
// directory, and removes it, once its owner is gone.
func ClaimDir(dir string) error {
	return os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}
