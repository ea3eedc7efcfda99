// Command sluice-bench prints Sluice's comparison benchmarks: each suite runs
// its variants interleaved in one process and prints medians and ratios.
//
//	go run ./cmd/sluice-bench                # every suite
//	go run ./cmd/sluice-bench -suite inbox   # one suite
//	go run ./cmd/sluice-bench -suite e2e,groupcommit -compare-amqp-url amqp://guest:guest@127.0.0.1:5682/
//	                                         # each suite on both brokers, side by side
//
// The numbers for this repository's machines are in docs/benchmarks.md.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"
	"unicode/utf8"

	_ "github.com/lib/pq" // the PostgreSQL driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/cmd/internal/bench"
	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/internal/diag"
)

func main() {
	if ran, err := bench.Worker(); ran { // a child process of the scaleout or outbox-memory suite
		if err != nil {
			fmt.Fprintln(os.Stderr, "sluice-bench: worker:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(run())
}

// run returns the exit code: 0 done, 1 a suite failed, 2 usage.
func run() int {
	o := bench.Options{Out: os.Stdout}
	suites := flag.String("suite", "all", "suites to run, comma-separated: inbox, e2e, publisher, consumer, stuck, overhead, inbox-scale, outcomes, dlq-stats, outbox, groupcommit, batchhandler, consumer-inbox, scaleout, ordering, outbox-memory, putback, framefilter, or all")
	flag.StringVar(&o.PostgresURL, "postgres-url", localenv.Get("SLUICE_BENCH_POSTGRES_URL", localenv.PostgresURL), "PostgreSQL URL")
	flag.StringVar(&o.AMQPURL, "amqp-url", localenv.Get("SLUICE_BENCH_AMQP_URL", localenv.AMQPURL), "RabbitMQ URL")
	flag.IntVar(&o.PublishBatch, "batch", 10000, "messages per batch in the publisher suite")
	flag.IntVar(&o.ScaleRows, "scale-rows", 10_000_000, "rows loaded into the inbox in the inbox-scale suite")
	flag.IntVar(&o.Messages, "messages", 500, "messages per variant per round")
	flag.IntVar(&o.Rounds, "rounds", 12, "rounds; medians are reported")
	flag.IntVar(&o.Prefetch, "prefetch", 0, "prefetch of Sluice's Consumer in the consumer suite (0: its default, 16)")
	compare := flag.String("compare-amqp-url", "", "a second RabbitMQ (e.g. the 4.0 node of make services, amqp://guest:guest@127.0.0.1:5682/): each suite runs on both, printed side by side")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	flag.Parse()
	if o.Messages < 1 || o.Rounds < 1 {
		fmt.Fprintln(os.Stderr, "sluice-bench: -messages and -rounds must be at least 1")
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sluice-bench: -cpuprofile:", err)
			return 2
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}

	all := map[string]func(context.Context, bench.Options) error{
		"inbox": bench.Inbox, "e2e": bench.EndToEnd, "publisher": bench.Publisher, "consumer": bench.Consumer, "stuck": bench.Stuck,
		"overhead": bench.Overhead, "inbox-scale": bench.InboxScale, "outcomes": bench.Outcomes, "dlq-stats": bench.DLQStats,
		"outbox":      bench.Outbox,
		"groupcommit": bench.GroupCommit, "batchhandler": bench.BatchHandlers, "consumer-inbox": bench.ConsumerInbox, "scaleout": bench.ScaleOut, "ordering": bench.Ordering,
		"outbox-memory": bench.OutboxMemory,
		"putback":       bench.PutBack,
		"framefilter":   bench.FrameFilter,
	}
	order := []string{"inbox", "e2e", "publisher", "consumer", "stuck", "overhead", "inbox-scale", "outcomes", "dlq-stats", "outbox", "groupcommit", "batchhandler", "consumer-inbox", "scaleout", "ordering", "outbox-memory", "putback", "framefilter"}
	want := order
	if *suites != "all" {
		want = strings.Split(*suites, ",")
	}
	for _, name := range want {
		if _, ok := all[name]; !ok {
			fmt.Fprintf(os.Stderr, "sluice-bench: unknown suite %q (want %s or all)\n", name, strings.Join(order, ", "))
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	for _, name := range want {
		if *compare != "" {
			if err := sideBySide(ctx, all[name], o, *compare); err != nil {
				fmt.Fprintf(os.Stderr, "sluice-bench: %s: %v\n", name, err)
				return 1
			}
			fmt.Println()
			continue
		}
		if err := all[name](ctx, o); err != nil {
			fmt.Fprintf(os.Stderr, "sluice-bench: %s: %v\n", name, err)
			return 1
		}
		fmt.Println()
	}
	return 0
}

// sideBySide runs suite on o's broker, then on the broker at other, and
// prints the two outputs in two columns, each under its broker's version.
func sideBySide(ctx context.Context, suite func(context.Context, bench.Options) error, o bench.Options, other string) error {
	var cols [2][]string
	for i, url := range []string{o.AMQPURL, other} {
		var buf bytes.Buffer
		run := o
		run.AMQPURL, run.Out = url, &buf
		if err := suite(ctx, run); err != nil {
			return fmt.Errorf("on %s: %w", diag.RedactURL(url), err)
		}
		cols[i] = append([]string{"RabbitMQ " + brokerVersion(url), ""}, strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")...)
	}
	width := 0
	for _, l := range cols[0] {
		width = max(width, utf8.RuneCountInString(l))
	}
	for i := range max(len(cols[0]), len(cols[1])) {
		var left, right string
		if i < len(cols[0]) {
			left = cols[0][i]
		}
		if i < len(cols[1]) {
			right = cols[1][i]
		}
		fmt.Printf("%s%s  │  %s\n", left, strings.Repeat(" ", width-utf8.RuneCountInString(left)), right)
	}
	return nil
}

// brokerVersion is the version the broker at url reports, or "?".
func brokerVersion(url string) string {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return "?"
	}
	defer func() { _ = conn.Close() }()
	return fmt.Sprint(conn.Properties["version"])
}
