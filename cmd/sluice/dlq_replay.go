package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/mattn/go-isatty"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
)

func newReplay(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var lf loopFlags
	var rateFlag, to, keyFile string
	var targets []string
	var batch int
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Republish selected messages to their queue, then remove them from the poison queue",
		Long: "Each selected message is published (confirmed, mandatory) to the queue in its\n" +
			"sluice_poison_queue header, with the attempt count reset and replay provenance headers,\n" +
			"and acked in the poison queue only after the confirm. Messages not selected stay, in order.\n" +
			"A message naming a queue outside the poison queue's family (or --target) is refused, dry run included.\n" +
			"A publish that fails stops the run with the message still in the poison queue; so does\n" +
			"a kill at any moment (a message may then be in both places: the inbox drops the duplicate).\n\n" +
			"Closed loop (--canary, --ramp, with --outcomes): the messages carry a replay run id; the\n" +
			"consumers' replay stage (router.Stages.Replay) records each one's outcome in the outcome\n" +
			"table. The canary batch must come back all processed (or duplicate); each ramp batch may be\n" +
			"poisoned again at most --max-repoison; after the ramp the last size repeats until nothing\n" +
			"selected is left. A stop prints the events that did not end well and exits 1.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			r, err := parseRate(rateFlag)
			if err != nil {
				return err
			}
			if batch < 1 {
				return usageError{fmt.Errorf("--batch must be at least 1")}
			}
			var sizes []int
			var maxRepoison float64
			if lf.active() {
				if sizes, maxRepoison, err = lf.sizes(); err != nil {
					return err
				}
				if dryRun {
					return usageError{errors.New("--dry-run lists what a replay would move; run it without --canary and --ramp")}
				}
			}
			f, conn, ctx, done, err := ff.open(g, true)
			if err != nil {
				return err
			}
			defer done()
			pub, err := newPublisher(g)
			if err != nil {
				return err
			}
			defer func() { _ = pub.Close() }()

			signer, err := signerFlag(keyFile)
			if err != nil {
				return err
			}
			prog := newProgress(out, ff.queue, queueDepth(conn, ff.queue))
			cfg := dlq.ReplayConfig{
				Filter: f, Limit: ff.limit, Rate: r, Batch: batch, DryRun: dryRun,
				To: to, Targets: targets,
			}
			op := dlq.Config{Operator: g.operator, Publisher: pub, Signer: signer}
			var res dlq.Result
			var runErr error
			if lf.active() {
				store, closeStore, err := openOutcomes(ctx, lf.outcomes, lf.table, true)
				if err != nil {
					return err
				}
				defer closeStore()
				cfg.Run = newRun("run")
				res, runErr = closedLoop(ctx, dlq.Open(conn, ff.queue, op), cfg, dlq.Loop{Sizes: sizes, Canary: lf.canary > 0, MaxRepoison: maxRepoison, Store: store, Wait: lf.wait, Where: outcomesPlace(lf.outcomes, lf.table)}, out)
			} else {
				cfg.Published = prog.published
				res, runErr = dlq.Open(conn, ff.queue, op).Replay(ctx, cfg)
			}
			runErr = flagHints(runErr)
			prog.done()
			summary(out, "replay", ff.queue, res, dryRun)
			opts := map[string]string{"rate": rateFlag, "batch": strconv.Itoa(batch), "limit": strconv.Itoa(ff.limit), "to": to,
				"run": cfg.Run, "canary": strconv.Itoa(lf.canary), "ramp": lf.ramp, "max_repoison": lf.maxRepoison,
				"target": strings.Join(targets, ",")}
			return errorsJoin(runErr, audit(g, "dlq replay", ff.queue, f, opts, res, dryRun, runErr))
		},
	}
	ff.register(cmd, "replay at most this many messages (0: all selected)")
	fl := cmd.Flags()
	fl.StringVar(&rateFlag, "rate", "", "at most this many messages per second, e.g. 20 or 20/s (default: no limit)")
	fl.IntVar(&batch, "batch", 10, "messages published, confirmed and acked together")
	fl.BoolVar(&dryRun, "dry-run", false, "select and count; publish and remove nothing")
	fl.StringVar(&to, "to", "", "replay every message to this queue instead of its sluice_poison_queue")
	fl.StringSliceVar(&targets, "target", nil, "a queue the replay may publish to (repeat it): --to and each message's sluice_poison_queue must be\n"+
		"one of them. Default: --to as given, and a message's own queue only when it is of the poison queue's\n"+
		"family by name (Q for Q.poison, or a partition Q.p<N>): anyone who can publish to the poison queue can name any queue")
	fl.StringVar(&keyFile, "signing-key-file", localenv.Get("SLUICE_SIGNING_KEY_FILE", ""),
		"the key the consumers' stages sign and verify with (signing.NewFromFile): each copy is signed, so the\n"+
			"consumers believe its replay run; a message whose diagnosis is not signed needs --to. Default env SLUICE_SIGNING_KEY_FILE")
	outcomeFlags(fl, &lf.outcomes, &lf.table, "the consumers' replay stage writes")
	fl.IntVar(&lf.canary, "canary", 0, "replay this many first and stop unless all were processed")
	fl.StringVar(&lf.ramp, "ramp", "", "then batches of these sizes, e.g. 5,20,100; the last size repeats")
	fl.StringVar(&lf.maxRepoison, "max-repoison", "10%", "stop when more than this share of a batch is poisoned again")
	fl.DurationVar(&lf.wait, "wait", 2*time.Minute, "how long to wait for a batch's outcomes")
	return cmd
}

func parseRate(v string) (float64, error) {
	if v == "" {
		return 0, nil
	}
	r, err := strconv.ParseFloat(strings.TrimSuffix(v, "/s"), 64)
	if err != nil || r <= 0 {
		return 0, usageError{fmt.Errorf("--rate %q: want a positive number of messages per second, e.g. 20/s", v)}
	}
	return r, nil
}

// progressView shows a progress bar on a terminal, plain lines otherwise.
type progressView struct {
	out     io.Writer
	pw      progress.Writer
	tracker *progress.Tracker
	last    int
	total   int
	moved   int // the messages confirmed so far
}

// queueDepth is queue's ready messages now, or 0 when it cannot be read.
func queueDepth(conn *amqp.Connection, queue string) int {
	q, err := amqpcall.Inspect(context.Background(), conn, callTimeout, queue)
	if err != nil {
		return 0
	}
	return q.Messages
}

// newProgress shows a replay's progress; total is the queue's depth at the
// start (0: unknown), the most that can be replayed.
func newProgress(out io.Writer, queue string, total int) *progressView {
	v := &progressView{out: out, total: total}
	raw := out // the bar draws with escape sequences of its own
	if t, ok := out.(interface{ Unwrap() io.Writer }); ok {
		raw = t.Unwrap()
	}
	if f, ok := raw.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		v.pw = progress.NewWriter()
		v.pw.SetOutputWriter(raw)
		v.pw.SetUpdateFrequency(100 * time.Millisecond)
		v.tracker = &progress.Tracker{Message: "replaying from " + diag.Printable(queue, 255), Total: int64(total), Units: progress.UnitsDefault}
		v.pw.AppendTracker(v.tracker)
		go v.pw.Render()
	}
	return v
}

// published is the replay's Published: it counts the messages confirmed
// so far and shows the count.
func (v *progressView) published(_ context.Context, ms []*dlq.Message) error {
	v.moved += len(ms)
	v.update(v.moved)
	return nil
}

func (v *progressView) update(done int) {
	if v.tracker != nil {
		v.tracker.SetValue(int64(done))
		return
	}
	if done-v.last >= 100 || v.last == 0 {
		if v.total > 0 {
			fmt.Fprintf(v.out, "replayed %d (the queue held %d at the start)\n", done, v.total)
		} else {
			fmt.Fprintf(v.out, "replayed %d\n", done)
		}
		v.last = done
	}
}

func (v *progressView) done() {
	if v.pw != nil {
		v.tracker.MarkAsDone()
		time.Sleep(150 * time.Millisecond) // the last render
		v.pw.Stop()
	}
}
