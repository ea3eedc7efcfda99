package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluicemq/sluice/internal/diag"
)

// Ctl runs rabbitmqctl args against one node and returns its output, or
// its error with the output (TryRabbitmqctl for the broker under test).
type Ctl func(ctx context.Context, args ...string) (string, error)

// NodeCtl is Ctl for node i of a private cluster.
func (c *PrivateCluster) NodeCtl(i int) Ctl {
	return func(_ context.Context, args ...string) (string, error) { return c.TryCtl(i, args...) }
}

// The node's refusal to boot that StartApp retries: RabbitMQ 4.0's
// boot-time check of a denied deprecated feature
// (scripts/rabbitmq4.sh denies transient_nonexcl_queues, as 4.3 does).
// rabbit:start runs the check (rabbit_ff_controller's
// list_deprecated_features_that_cant_be_denied) right after
// mnesia:start(), which returns before Mnesia has loaded its tables; the
// check reads rabbit_queue through khepri_mnesia_migration's
// handle_fallback, which retries a table that does not exist yet 100
// times without waiting (about 70 ms), and a check that fails counts as
// "in use". When Mnesia's load of rabbit_queue outlasts those retries (a
// loaded machine, a node with many queues), the node refuses to boot with
// this reason and the log line "Mnesia->Khepri fallback handling: Mnesia
// function failed 99 times". A start of the whole node runs the same code
// (run_prelaunch_second_phase, then the same check) and races the same
// way; each start is a new draw of the race, so another start_app boots.
// Seen on a fresh machine's make test, and reproduced on a private 4.0
// node: 1 of 10 stop_app/start_app cycles under stress-ng refused.
const denyRace = "failed_to_deny_deprecated_features"

// startAppAttempts bounds start_app's runs: each refused one is an
// independent draw of the race above.
const startAppAttempts = 6

// startAppPause is the pause after the first refused run, longer by as
// much after each next one (1 s, 2 s, …). A constant: the tests that
// inject refusals give theirs as an argument (startApp, awaitBoot), so
// that no test's pause is another's data race.
const startAppPause = time.Second

// Boot is how a node's start_app went.
type Boot struct {
	Attempts int      // start_app runs (1 when it booted at once)
	Refused  []string // why each refused run was refused, a line each
}

// String says which way the start took, for a scenario's or a test's output.
func (b Boot) String() string {
	if len(b.Refused) == 0 {
		return "start_app booted at once"
	}
	return fmt.Sprintf("start_app booted on attempt %d: RabbitMQ refused %d start(s) with %s (its boot check of a denied deprecated feature raced Mnesia's table load; see testenv.StartApp), retried",
		b.Attempts, len(b.Refused), denyRace)
}

// StartApp runs start_app on the node ctl manages and returns once it
// serves (await_startup). While the node refuses to boot with RabbitMQ
// 4.0's deprecated-feature race (denyRace), it runs start_app again, after
// a pause, at most startAppAttempts times in all. Any other failure, or
// the last refusal, is returned at once with the node's log lines of that
// start (root: the directory the node runs from, RabbitMQRoot or "").
func StartApp(ctx context.Context, ctl Ctl, root string) (Boot, error) {
	return startApp(ctx, ctl, root, startAppPause)
}

// startApp is StartApp with the pause after the first refused run.
func startApp(ctx context.Context, ctl Ctl, root string, pause time.Duration) (Boot, error) {
	var b Boot
	for {
		b.Attempts++
		out, err := ctl(ctx, "start_app")
		if err == nil {
			if _, err := ctl(ctx, "await_startup"); err != nil {
				return b, fmt.Errorf("%w\nthe node's log:\n%s", err, NodeLog(ctx, ctl, root))
			}
			return b, nil
		}
		refused := strings.Contains(out+err.Error(), denyRace)
		if !refused || b.Attempts >= startAppAttempts || ctx.Err() != nil {
			return b, fmt.Errorf("the node did not boot (start_app run %d times; %s): %w\nthe node's log:\n%s",
				b.Attempts, b, err, NodeLog(ctx, ctl, root))
		}
		b.Refused = append(b.Refused, diag.Summary(err, 300))
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(b.Attempts) * pause):
		}
	}
}

// Restart is how RestartApp went.
type Restart struct {
	Boot
	Down time.Duration // from stop_app's return to start_app's first run
	Took time.Duration // from stop_app's run to the node serving again
}

// RestartApp stops the node's application (stop_app: its VM stays up),
// waits down (or ctx's end) and starts it again with StartApp.
func RestartApp(ctx context.Context, ctl Ctl, root string, down time.Duration) (Restart, error) {
	start := time.Now()
	if _, err := ctl(ctx, "stop_app"); err != nil {
		return Restart{}, err
	}
	stopped := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(down):
	}
	r := Restart{Down: time.Since(stopped)}
	var err error
	r.Boot, err = StartApp(ctx, ctl, root)
	r.Took = time.Since(start)
	return r, err
}

// nodeLogLines bounds what NodeLog returns.
const nodeLogLines = 40

// NodeLog returns the warning and error lines of the node's log since its
// last start ("RabbitMQ is asked to start"), at most nodeLogLines of them
// (the last), each bounded: the node names its log (rabbit:log_locations,
// which answers while the application is stopped); root is the directory
// the node runs from (its paths are inside it). It says why when it cannot.
func NodeLog(ctx context.Context, ctl Ctl, root string) string {
	out, err := ctl(ctx, "-q", "eval", "rabbit:log_locations().")
	if err != nil {
		return "(the node did not name its log: " + diag.Summary(err, 200) + ")"
	}
	var file string
	for f := range strings.SplitSeq(strings.Trim(strings.TrimSpace(out), "[]"), ",") {
		f = strings.Trim(strings.TrimSpace(f), `"`)
		if strings.HasSuffix(f, ".log") && !strings.Contains(f, "_upgrade") {
			file = f
			break
		}
	}
	if file == "" {
		return "(the node logs to no file: " + diag.Summary(errors.New(out), 200) + ")"
	}
	lines, err := bootLines(filepath.Join(root, file))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return strings.Join(lines, "\n")
}

// bootLines reads file's warning and error lines since the last start,
// at most nodeLogLines of them (the last).
func bootLines(file string) ([]string, error) {
	lines, err := bootLog(file)
	if len(lines) > nodeLogLines {
		lines = append([]string{fmt.Sprintf("… %d lines before", len(lines)-nodeLogLines)}, lines[len(lines)-nodeLogLines:]...)
	}
	return lines, err
}

// bootLog reads file's warning and error lines since the last start, all
// of them, each bounded.
func bootLog(file string) ([]string, error) {
	f, err := os.Open(file) // #nosec G304 -- the node's own log, named by the node
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.Contains(l, "RabbitMQ is asked to start"):
			lines = lines[:0]
		case strings.Contains(l, "[error]"), strings.Contains(l, "[warning]"), strings.Contains(l, "BOOT FAILED"):
			lines = append(lines, diag.Printable(l, 240))
		}
	}
	return lines, sc.Err()
}

// bootFailure reads file, the log of a node that is booting: whether the
// boot failed (BOOT FAILED), whether with denyRace, and the lines that say
// why — from BOOT FAILED on, at most nodeLogLines of them.
func bootFailure(file string) (why []string, failed, race bool) {
	lines, _ := bootLog(file) // no log yet: still booting
	i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "BOOT FAILED") })
	if i < 0 {
		return nil, false, false
	}
	why = lines[i:]
	race = slices.ContainsFunc(why, func(l string) bool { return strings.Contains(l, denyRace) })
	if len(why) > nodeLogLines {
		why = append(why[:nodeLogLines:nodeLogLines], fmt.Sprintf("… %d lines after", len(why)-nodeLogLines))
	}
	return why, true, race
}
