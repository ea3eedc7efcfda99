package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// PrivatePostgres is a PostgreSQL server of one test's own, which the test
// may stop and start; the shared one is never touched.
type PrivatePostgres struct {
	// URL of database postgres, trust authentication.
	URL  string
	dir  string
	port int
	ctl  func(t testing.TB, args ...string)
}

// StartPrivatePostgres initialises a cluster in a temporary directory
// (initdb), starts it on a free port of 127.0.0.1 (pg_ctl) and stops it,
// with its files removed, when t ends. It needs PostgreSQL's server
// binaries; as root the cluster runs as the postgres user.
func StartPrivatePostgres(t testing.TB) *PrivatePostgres {
	t.Helper()
	return StartPrivatePostgresWith(t, 100)
}

// StartPrivatePostgresWith is StartPrivatePostgres with max_connections
// maxConnections: a server whose clients run out ("too many clients",
// 53300).
func StartPrivatePostgresWith(t testing.TB, maxConnections int) *PrivatePostgres {
	t.Helper()
	bin := postgresBin(t)
	dir, err := os.MkdirTemp("", "sluice-postgres-")
	require.NoError(t, err)
	require.NoError(t, ClaimDir(dir))
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p := &PrivatePostgres{dir: filepath.Join(dir, "data"), port: freePort(t)}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	if os.Geteuid() == 0 {
		require.NoError(t, exec.CommandContext(context.Background(), "chown", "postgres:postgres", dir).Run())
	}
	p.run(t, filepath.Join(bin, "initdb"), "-D", p.dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
	opts := "-c listen_addresses=127.0.0.1 -c port=" + strconv.Itoa(p.port) +
		" -c unix_socket_directories=" + dir + " -c fsync=off -c max_connections=" + strconv.Itoa(maxConnections) +
		" -c superuser_reserved_connections=0"
	p.ctl = func(t testing.TB, args ...string) {
		t.Helper()
		p.run(t, filepath.Join(bin, "pg_ctl"), append([]string{"-D", p.dir, "-o", opts, "-w", "-t", "60", "-l", filepath.Join(dir, "log")}, args...)...)
	}
	p.Start(t)
	t.Cleanup(func() { _ = p.command(filepath.Join(bin, "pg_ctl"), "-D", p.dir, "-m", "immediate", "stop").Run() })
	return p
}

// Stop stops the server at once (pg_ctl stop -m immediate): connections
// are cut, new ones refused.
func (p *PrivatePostgres) Stop(t testing.TB) {
	t.Helper()
	p.ctl(t, "-m", "immediate", "stop")
}

// Start starts the server and waits until it accepts connections.
func (p *PrivatePostgres) Start(t testing.TB) {
	t.Helper()
	p.ctl(t, "start")
}

func (p *PrivatePostgres) command(name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.CommandContext(context.Background(), "runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return exec.CommandContext(context.Background(), name, args...)
}

func (p *PrivatePostgres) run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := p.command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %v: %s", filepath.Base(name), args, out)
}

// postgresBin finds the newest PostgreSQL server binaries.
func postgresBin(t testing.TB) string {
	t.Helper()
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		t.Fatal("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (apt-get install postgresql)")
	}
	return filepath.Dir(matches[len(matches)-1])
}

// AwaitLockWait waits up to 2 minutes for a statement whose text holds text
// to have waited for a lock longer than older (pg_stat_activity, read
// through db): a claim blocked by a key another open transaction holds.
// It fails t if the call that should be waiting returned first (returned
// yields its outcome).
func AwaitLockWait(t testing.TB, db *sqlx.DB, text string, older time.Duration, returned <-chan error) {
	t.Helper()
	var early error
	back := false
	require.Eventually(t, func() bool {
		select {
		case early = <-returned:
			back = true
			return true
		default:
		}
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND position($1 IN query) > 0 AND clock_timestamp() - query_start > $2::interval`,
			text, fmt.Sprintf("%d milliseconds", older.Milliseconds())))
		return n > 0
	}, 2*time.Minute, 20*time.Millisecond, "no statement on %s waited for a lock longer than %s", text, older)
	require.False(t, back, "returned before its statement waited for the lock: %v", early)
}
