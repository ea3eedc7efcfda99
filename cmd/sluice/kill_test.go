package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
)

// TestKillMidReplayLosesNothing kills the real binary (SIGKILL) in the middle
// of a rate-limited replay: every event is then in the poison queue, in the
// target queue, or in both — never in neither.
func TestKillMidReplayLosesNothing(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)

	b := newBed(t)
	const n = 30
	for i := range n {
		b.poisoned(t, fmt.Sprint("k", i), "order.created", sluice.Poison(errors.New("bad")))
	}
	cmd := exec.Command(bin, "--amqp-url", testenv.AMQPURL, "--audit", b.audit,
		"dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--rate", "40/s", "--batch", "2")
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue) >= 6 }, time.Minute, 5*time.Millisecond)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	seen := map[string]int{}
	for _, id := range append(ids(t, b.topo.Config().Queue), ids(t, b.topo.Config().PoisonQueue)...) {
		seen[id]++
	}
	for i := range n {
		require.Positive(t, seen[fmt.Sprint("k", i)], "k%d was lost", i)
	}
	replayed := 0
	for _, c := range seen {
		replayed += c
	}
	require.Less(t, replayed-n, 3, "at most the batch in flight is in both places")
	t.Logf("killed mid-run: %d events, %d copies in all", n, replayed)
}

// TestKillMidRampThenRerun kills the real binary (SIGKILL) in the middle of
// a closed-loop replay, then runs it again: every event ends processed
// exactly once (one business row, one inbox row), none is left in the
// poison queue, and the report of both runs is complete.
func TestKillMidRampThenRerun(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)

	b := newBed(t)
	const n = 120
	b.exhausted(t, "r", n)
	rc := newRecovering(t, b, func(string) bool { return false })
	args := []string{"--amqp-url", testenv.AMQPURL, "--audit", b.audit, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue,
		"--canary", "5", "--ramp", "20,50", "--rate", "60/s", "--batch", "2",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait}
	db, rows := rc.pg, func() int { return rc.rows(t) }
	cmd := exec.Command(bin, args...)
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return rows() >= 30 }, 2*time.Minute, 5*time.Millisecond, "mid-ramp")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killedAt := rows()

	out, err := exec.Command(bin, args...).CombinedOutput()
	require.NoError(t, err, "the rerun replays the rest: %s", out)
	if err := testenv.AwaitCount(n, 2*time.Minute, 10*time.Minute, rows); err != nil {
		t.Fatalf("every event processed after the rerun: %v; %s", err, testenv.QueueDepths(t, testenv.AMQP(t), b.topo.Config().Queue, b.topo.Config().PoisonQueue))
	}
	var distinct, claims int
	require.NoError(t, db.Get(&distinct, `SELECT count(DISTINCT event_id) FROM `+rc.db+`.stock`))
	require.NoError(t, db.Get(&claims, `SELECT count(*) FROM `+rc.db+`.inbox`))
	require.Equal(t, n, distinct)
	require.Equal(t, n, claims)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue) == 0 }, time.Minute, 10*time.Millisecond)
	require.Empty(t, peekIDs(t, b.topo.Config().PoisonQueue), "nothing left in the poison queue")

	code, report, errOut := b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable)
	require.Equal(t, 0, code, "both runs' reports are complete: %s %s", report, errOut)
	require.Equal(t, 2, strings.Count(report, "run run-"), report)
	t.Logf("killed with %d of %d processed; report:\n%s", killedAt, n, report)
}

// TestKillAtAnyPointOfTheClosedLoop kills the real binary (SIGKILL) at four
// points of a closed-loop replay of 100 events, 10 of them still bad — in the
// canary, in the middle of a batch, between a publish's confirm and its ack
// (the event is then in both queues: the rerun records it "duplicate"), and
// while it waits for a batch's outcomes — then runs it again (without the
// canary). Each time every event ends in exactly one
// place: the 90 good ones processed once (one business row, one inbox row),
// the 10 bad ones back in the poison queue; and the report of both runs is
// complete.
func TestKillAtAnyPointOfTheClosedLoop(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)

	const n = 100
	bad := func(id string) bool { return strings.HasSuffix(id, "9") } // k009, k019, …: 2 in each batch of 20
	const slow = "k024"                                               // the last event of the first batch of 20
	for _, point := range []string{"canary", "mid-batch", "between-confirm-and-ack", "awaiting-outcomes"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			b := newBed(t)
			var want []string
			for i := range n {
				id := fmt.Sprintf("k%03d", i)
				b.poisoned(t, id, "order.created", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
				if bad(id) {
					want = append(want, id)
				}
			}
			var slowStarted atomic.Bool
			release := make(chan struct{}) // closed once the CLI is killed
			rc := newRecovering(t, b, func(id string) bool {
				if id == slow && (point == "awaiting-outcomes" || point == "between-confirm-and-ack") && !slowStarted.Swap(true) {
					select { // the batch's last outcome is late: the CLI waits for it until killed (the wait for the point below is 2 minutes at most)
					case <-release:
					case <-time.After(3 * time.Minute):
					}
				}
				return bad(id)
			})
			db, rows := rc.pg, func() int { return rc.rows(t) }
			args := []string{"--amqp-url", testenv.AMQPURL, "--audit", b.audit, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue,
				"--canary", "5", "--ramp", "20,100", "--max-repoison", "25%", "--rate", "100/s", "--batch", "2",
				"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait}
			cmd := exec.Command(bin, args...)
			require.NoError(t, cmd.Start())
			switch point {
			case "canary":
				require.Eventually(t, func() bool { return rows() >= 1 }, 2*time.Minute, time.Millisecond)
			case "mid-batch":
				require.Eventually(t, func() bool { return rows() >= 12 }, 2*time.Minute, time.Millisecond)
			case "between-confirm-and-ack": // k024 is consumed as soon as its publish is confirmed, before the CLI records and acks it
				require.Eventually(t, slowStarted.Load, 2*time.Minute, time.Millisecond)
			case "awaiting-outcomes": // the first 25 acked, k009 and k019 poisoned again, k024 still in its handler
				require.Eventually(t, func() bool {
					return slowStarted.Load() && testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().PoisonQueue) == n-25+2
				}, 2*time.Minute, time.Millisecond)
			}
			require.NoError(t, cmd.Process.Kill())
			_ = cmd.Wait()
			close(release)
			killedAt := rows()

			// The rerun resumes without a canary: the first run's verified the fix,
			// and the queue's head may now be a bad event the first run put back.
			rerun := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--canary" || a == "5" })
			out, _ := exec.Command(bin, rerun...).CombinedOutput()
			if err := testenv.AwaitCount(n-len(want), 2*time.Minute, 10*time.Minute, rows); err != nil {
				t.Fatalf("every good event processed after the rerun: %v; %s; the rerun:\n%s", err,
					testenv.QueueDepths(t, testenv.AMQP(t), b.topo.Config().Queue, b.topo.Config().PoisonQueue), out)
			}
			require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue) == 0 }, time.Minute, 10*time.Millisecond)
			var distinct, claims int
			require.NoError(t, db.Get(&distinct, `SELECT count(DISTINCT event_id) FROM `+rc.db+`.stock`))
			require.NoError(t, db.Get(&claims, `SELECT count(*) FROM `+rc.db+`.inbox`))
			require.Equal(t, n-len(want), distinct, "every good event processed")
			require.Equal(t, n-len(want), claims, "and claimed once")
			left := peekIDs(t, b.topo.Config().PoisonQueue)
			slices.Sort(left)
			left = slices.Compact(left)
			require.Equal(t, want, left, "exactly the bad events are back in the poison queue:\n%s", out)

			code, report, errOut := b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable)
			require.Equal(t, 0, code, "both runs' reports are complete: %s %s\nthe rerun:\n%s", report, errOut, out)
			var dups []string
			require.NoError(t, db.Select(&dups, `SELECT item FROM `+rc.outcomesTable+` WHERE outcome = 'duplicate' ORDER BY item`))
			t.Logf("killed %s with %d of %d processed (duplicates on the rerun: %v); rerun:\n%s\nreport:\n%s", point, killedAt, n-len(want), dups, out, report)
		})
	}
}

// An operator's Ctrl-C (SIGINT) in the middle of a closed-loop replay: the
// binary stops, exits 1, writes the audit line with the run and the error,
// and loses nothing — the rest waits in the poison queue for a rerun.
func TestInterruptMidRamp(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)

	b := newBed(t)
	const n = 60
	b.exhausted(t, "s", n)
	rc := newRecovering(t, b, func(string) bool { return false })
	rows := func() int { return rc.rows(t) }
	cmd := exec.Command(bin, "--amqp-url", testenv.AMQPURL, "--audit", b.audit, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue,
		"--canary", "5", "--ramp", "20", "--rate", "40/s", "--batch", "2",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return rows() >= 10 }, 2*time.Minute, time.Millisecond)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Equal(t, 1, exit.ExitCode(), "stderr: %s", stderr.String())
	require.Contains(t, stderr.String(), "interrupted: what was done before is in the audit log")

	recs := b.auditLines(t)
	require.Len(t, recs, 1)
	require.Equal(t, "error", recs[0].Outcome)
	require.Contains(t, recs[0].Options["run"], "run-")
	require.Positive(t, recs[0].Result.Replayed)

	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue) == 0 }, time.Minute, 10*time.Millisecond)
	// A replayed event may still be in the recovering consumer's handler
	// (not ready in its queue, not yet a row), and the CLI's unacked ones
	// go back to the poison queue once the broker has closed its channel:
	// wait for every event to be in one place or the other.
	left := 0
	require.NoError(t, testenv.AwaitCount(n, 2*time.Minute, 10*time.Minute, func() int {
		left = len(peekIDs(t, b.topo.Config().PoisonQueue))
		return rows() + left
	}), "every event processed or still in the poison queue")
	t.Logf("interrupted with %d of %d processed, %d left in the poison queue; stderr: %s", rows(), n, left, stderr.String())
}
