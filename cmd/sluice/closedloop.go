package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the outcome table's PostgreSQL driver
	"github.com/redis/go-redis/v9"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/cmd/internal/dlq"
	amqp "github.com/sluicemq/sluice/internal/amqp091"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/replay/redisstore"
	replaysql "github.com/sluicemq/sluice/replay/sqlstore"
)

// listMax bounds the events a stop lists; the report lists them all.
const listMax = 50

// errStopped ends a closed-loop replay that stopped on its own rule.
var errStopped = errors.New("replay stopped")

// loopFlags are the closed-loop flags of replay.
type loopFlags struct {
	outcomes    string
	table       string
	canary      int
	ramp        string
	maxRepoison string
	wait        time.Duration
}

func (l *loopFlags) active() bool { return l.canary > 0 || l.ramp != "" }

// sizes returns the batch sizes: the canary, then the ramp.
func (l *loopFlags) sizes() ([]int, float64, error) {
	var sizes []int
	if l.canary < 0 {
		return nil, 0, usageError{fmt.Errorf("--canary must be positive, got %d", l.canary)}
	}
	if l.canary > 0 {
		sizes = append(sizes, l.canary)
	}
	if l.ramp != "" {
		for _, p := range strings.Split(l.ramp, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 1 {
				return nil, 0, usageError{fmt.Errorf("--ramp %q: want batch sizes such as 5,20,100", l.ramp)}
			}
			sizes = append(sizes, n)
		}
	}
	maxRepoison := 0.1
	if l.maxRepoison != "" {
		v, err := strconv.ParseFloat(strings.TrimSuffix(l.maxRepoison, "%"), 64)
		if err != nil || v < 0 || v > 100 {
			return nil, 0, usageError{fmt.Errorf("--max-repoison %q: want a percentage such as 10%%", l.maxRepoison)}
		}
		maxRepoison = v / 100
	}
	if l.outcomes == "" {
		return nil, 0, usageError{errors.New("--canary and --ramp need --outcomes (the database the consumers' replay stage records into)")}
	}
	if err := checkOutcomesURL(l.outcomes); err != nil {
		return nil, 0, err
	}
	if l.wait <= 0 {
		return nil, 0, usageError{fmt.Errorf("--wait must be positive, got %s", l.wait)}
	}
	return sizes, maxRepoison, nil
}

// outcomeSchemes are the --outcomes URLs the CLI reads and writes.
const outcomeSchemes = "postgres:// or postgresql:// (or a key=value DSN: the outcome table), redis:// or rediss:// (replay/redisstore)"

// checkOutcomesURL refuses an --outcomes URL of a scheme the CLI cannot
// open (mysql://…: a MariaDB service's operators read its table there).
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
// key prefix without its colon: replay/redisstore). With create the table is
// created when it is missing (a command that starts a run); without it (the
// read-only report, resolve, which records into an existing run) a missing
// table is an error naming it and the flags.
func openOutcomes(url, table string, create bool) (ledger.Ledger, func(), error) {
	if err := checkOutcomesURL(url); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if isRedis(url) {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, usageError{fmt.Errorf("--outcomes: %w", diag.RedactError(err))}
		}
		redis.SetLogger(quietRedis{}) // its pool's retries would print lines of their own; the error says it
		opts.MaxRetries = 1
		client := redis.NewClient(opts)
		if err := client.Ping(ctx).Err(); err != nil {
			_ = client.Close()
			return nil, nil, fmt.Errorf("--outcomes: %w", diag.RedactError(err))
		}
		s, err := redisstore.New(redisstore.Config{Client: client, Prefix: table + ":"})
		if err != nil {
			_ = client.Close()
			return nil, nil, fmt.Errorf("--outcomes: %w", err)
		}
		return s, func() { _ = client.Close() }, nil
	}
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		return nil, nil, fmt.Errorf("--outcomes: %w", diag.RedactError(err))
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("--outcomes: %w", diag.RedactError(err))
	}
	s, err := replaysql.New(replaysql.Config{DB: db, Table: table})
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

// tableExists returns an error naming table and the flags when the
// database at --outcomes has no such table (to_regclass: the name as the
// store uses it, on the search path unless schema-qualified).
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

// quietRedis drops go-redis's own log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// outcomesPlace names where the records are, for a message.
func outcomesPlace(url, table string) string {
	if isRedis(url) {
		return "key prefix " + diag.Printable(table, 128) + ":"
	}
	return "table " + diag.Printable(table, 128)
}

// loop is a closed-loop replay's plan.
type loop struct {
	sizes       []int // the canary's, then the ramp's
	canary      bool  // sizes[0] is a canary
	maxRepoison float64
	store       ledger.Ledger
	wait        time.Duration
	where       string // the records' place, for a message: "table T", "key prefix P:"
}

// closedLoop replays in batches — the canary, then the ramp, then the last
// size again until nothing selected is left — and after each batch waits
// for the consumers' outcomes. The canary must come back all processed or
// duplicate; a ramp batch may be poisoned again at most max. A stop prints
// every item of the batch that did not end well and returns errStopped.
func closedLoop(ctx context.Context, conn *amqp.Connection, cfg dlq.ReplayConfig, l loop, out io.Writer) (dlq.ReplayResult, error) {
	total := dlq.ReplayResult{ByTarget: map[string]int{}}
	cfg.Filter.NotRun = cfg.Run
	limit := cfg.Limit
	fmt.Fprintf(out, "replay run %s\n", cfg.Run)
	for step := 0; ; step++ {
		size := l.sizes[min(step, len(l.sizes)-1)]
		if limit > 0 {
			size = min(size, limit-total.Replayed)
			if size <= 0 {
				return total, nil
			}
		}
		items := map[string]bool{}
		c := cfg
		c.Limit = size
		c.Published = func(ctx context.Context, ms []*dlq.Message) error {
			rs := make([]replay.Record, len(ms))
			for i, m := range ms {
				items[m.Item()] = true
				rs[i] = replay.Record{Run: cfg.Run, Item: m.Item(), EventID: m.EventID, At: time.Now()}
			}
			return l.store.Replayed(ctx, rs)
		}
		res, err := dlq.Replay(ctx, conn, c)
		// Messages read: every batch reads the queue again from its head,
		// through what earlier batches left, so the messages read so far are
		// those replayed before and those this batch read.
		total.Scanned = max(total.Scanned, total.Replayed+res.Scanned)
		total.Selected += res.Selected
		total.Replayed += res.Replayed
		for k, v := range res.ByTarget {
			total.ByTarget[k] += v
		}
		if err != nil || res.Replayed == 0 {
			return total, err
		}
		stage := "ramp"
		if step == 0 && l.canary {
			stage = "canary"
		}
		rs, err := awaitOutcomes(ctx, l.store, cfg.Run, items, l.wait)
		if err != nil {
			return total, err
		}
		// Counted by item: two copies of one event (a poisoning redelivered)
		// are one item with one outcome.
		n := len(items)
		final, poisoned := ledger.Count(rs, items)
		copies := ""
		if n != res.Replayed {
			copies = fmt.Sprintf(" (%d events)", n)
		}
		fmt.Fprintf(out, "batch %d (%s, %d): %d replayed%s, %d with a final outcome, %d poisoned again\n",
			step+1, stage, size, res.Replayed, copies, final, poisoned)
		var bad []replay.Record
		badFinal, heard := 0, map[string]bool{}
		for _, r := range rs {
			if !items[r.Item] {
				continue
			}
			if r.Outcome != ledger.OutcomeReplayed {
				heard[r.Item] = true // a consumer recorded something
			}
			if r.Outcome != sluice.OutcomeProcessed && r.Outcome != sluice.OutcomeDuplicate {
				bad = append(bad, r)
				if ledger.Final(r.Outcome) {
					badFinal++
				}
			}
		}
		silent := n - len(heard) // items still only "replayed": no consumer's record
		rate := float64(poisoned) / float64(n)
		noStage := fmt.Sprintf("does the consumer run the replay stage (router.Stages.Replay) recording into %s of --outcomes?", l.where)
		var why string
		switch {
		case silent == n:
			why = fmt.Sprintf("no outcome recorded within --wait %s for any of the %d events: %s", l.wait, n, noStage)
		case stage == "canary" && badFinal > 0:
			why = fmt.Sprintf("%d of the %d canary events were not processed", badFinal, n)
		case final < n && silent > 0:
			why = fmt.Sprintf("%d of %d events had no final outcome within --wait %s, %d with no outcome recorded at all: %s", n-final, n, l.wait, silent, noStage)
		case final < n:
			why = fmt.Sprintf("%d of %d events had no final outcome within --wait %s", n-final, n, l.wait)
		case rate > l.maxRepoison:
			why = fmt.Sprintf("%.0f%% poisoned again, more than --max-repoison %.0f%%", 100*rate, 100*l.maxRepoison)
		}
		if why != "" {
			fmt.Fprintf(out, "stopped: %s\n", why)
			for i, r := range bad {
				if i == listMax {
					fmt.Fprintf(out, "  … and %d more\n", len(bad)-listMax)
					break
				}
				fmt.Fprintf(out, "  %s\t%s\t%s\t%s\n", diag.Printable(cmp.Or(r.EventID, r.Item), 128), diag.Printable(string(r.Outcome), 32), diag.Printable(r.Class, 32), diag.Printable(r.Reason, 200))
			}
			fmt.Fprintf(out, "see: sluice dlq report --outcomes ... --run %s\n", cfg.Run)
			return total, fmt.Errorf("%w: %s (run %s)", errStopped, why, cfg.Run)
		}
	}
}

// operatorRecords records, when --outcomes was given, what an operator's
// command did to each item, under a run of its own ("archive-…",
// "discard-…", "resolve-…").
type operatorRecords struct {
	url, table string
	g          *globals
	rs         []replay.Record
	// create makes a missing outcome table (archive, discard: a run of their
	// own); resolve records into an existing run's table.
	create bool
}

func (o *operatorRecords) add(outcome sluice.Outcome, item, eventID, class, reason string) {
	if o.url == "" {
		return
	}
	o.rs = append(o.rs, replay.Record{Item: item, EventID: eventID, Outcome: outcome, Class: class,
		Reason: diag.Bound(reason, replay.ReasonMaxLength), Handler: "operator " + o.g.operator, At: time.Now().UTC()})
}

// flush writes the records under run and returns it, or "" when there was
// nothing to write.
func (o *operatorRecords) flush(ctx context.Context, run string) (string, error) {
	if o.url == "" || len(o.rs) == 0 {
		return "", nil
	}
	store, closeStore, err := openOutcomes(o.url, o.table, o.create)
	if err != nil {
		return "", err
	}
	defer closeStore()
	for i := range o.rs {
		o.rs[i].Run = run
	}
	if err := store.Records(ctx, o.rs); err != nil {
		return "", fmt.Errorf("recording the outcomes (the audit log has them): %w", diag.RedactError(err))
	}
	return run, nil
}

// newRun returns a new run id: kind, the time, and a random tail.
func newRun(kind string) string {
	return kind + "-" + time.Now().UTC().Format("20060102T150405Z") + "-" + watermill.NewShortUUID()[:8]
}

// awaitOutcomes polls the store until every item has a final outcome, or
// wait passes; it returns the run's records.
func awaitOutcomes(ctx context.Context, store ledger.Ledger, run string, items map[string]bool, wait time.Duration) ([]replay.Record, error) {
	deadline := time.Now().Add(wait)
	keys := slices.Collect(maps.Keys(items))
	for {
		rs, err := store.Items(ctx, run, keys)
		if err != nil {
			return nil, fmt.Errorf("reading the outcomes: %w", diag.RedactError(err))
		}
		if final, _ := ledger.Count(rs, items); final == len(items) || time.Now().After(deadline) {
			return rs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
