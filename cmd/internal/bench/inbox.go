package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/unitofwork"
)

// Inbox compares, on PostgreSQL, a handler doing one business INSERT:
//
//	(a) in a transaction of its own, no inbox;
//	(b) with the inbox written by hand: claim INSERT ... ON CONFLICT DO NOTHING
//	    and the business INSERT in one transaction, plain database/sql;
//	(c) behind Sluice's deduplication middleware (SQLStore, the default
//	    ClaimTimeout: a deadline on the claim's context);
//	(d) the same with ClaimTimeout < 0 (no deadline of its own).
//
// at concurrency 1 and 8, and reports c/b (the library's cost over the same
// SQL by hand), d/b (the same without the lock timeout) and c/a (the cost of
// the extra statement).
func Inbox(ctx context.Context, o Options) error {
	var writes atomic.Int64
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench", 16, &writes)
	if err != nil {
		return err
	}
	defer cleanup()
	db.SetMaxIdleConns(16)

	v, err := newInboxVariants(ctx, db, schema)
	if err != nil {
		return err
	}
	names := []string{"a: plain tx", "b: inbox by hand", "c: sluice inbox", "d: sluice, no claim timeout"}
	ops := []func(run string) Op{v.plain, v.byHand, v.sluice(v.mw), v.sluice(v.mwNoLock)}

	fmt.Fprintf(o.Out, "Inbox on PostgreSQL: %d rounds of %d messages per variant, variants interleaved; rates are medians, ratios medians of per-round ratios\n\n", o.Rounds, o.Messages)
	var rows [][]string
	for _, conc := range []int{1, 8} {
		rates, err := Interleave(ctx, o, conc, len(ops), func(round, i int) Op {
			return ops[i](fmt.Sprintf("c%d-r%d-v%d-", conc, round, i))
		}, v.truncate)
		if err != nil {
			return err
		}
		rows = append(rows, []string{strconv.Itoa(conc),
			f0(Median(rates[0])), f0(Median(rates[1])), f0(Median(rates[2])), f0(Median(rates[3])),
			f2(MedianRatio(rates[2], rates[1])), f2(MedianRatio(rates[3], rates[1])), f2(MedianRatio(rates[2], rates[0]))})
	}
	Table(o.Out, []string{"concurrency", names[0] + " msg/s", names[1] + " msg/s", names[2] + " msg/s", names[3] + " msg/s", "c÷b", "d÷b", "c÷a"}, rows)
	fmt.Fprintln(o.Out, "\ntargets: c÷b ≥ 0.95; c÷a ≈ 0.7–0.8 expected (one more statement per message)")

	// What each variant sends: writes to the server per message, one at a time.
	var wire []string
	for i, op := range ops {
		w, err := writesPerMessage(ctx, &writes, 200, op("wire-"))
		if err != nil {
			return err
		}
		wire = append(wire, fmt.Sprintf("%s %.1f", names[i][:1], w))
	}
	fmt.Fprintf(o.Out, "writes to PostgreSQL per message (200 in a row): %s\n", strings.Join(wire, ", "))
	return nil
}

type inboxVariants struct {
	db                  *sqlx.DB
	schema              string
	insertBiz, claimSQL string
	// insertBizBatch inserts the comma-separated keys $1, one row each.
	insertBizBatch string
	store          *sluicesql.Inbox // c's
	mw, mwNoLock   message.HandlerFunc
}

func newInboxVariants(ctx context.Context, db *sqlx.DB, schema string) (*inboxVariants, error) {
	v := &inboxVariants{db: db, schema: schema}
	for _, stmt := range []string{
		"CREATE TABLE " + schema + ".reservations (event_key TEXT NOT NULL, note TEXT NOT NULL)",
		"CREATE TABLE " + schema + ".inbox_by_hand (consumer TEXT NOT NULL, event_key TEXT NOT NULL, processed_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (consumer, event_key))",
		"CREATE INDEX ON " + schema + ".inbox_by_hand (processed_at)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, err
		}
	}
	v.insertBiz = "INSERT INTO " + schema + ".reservations (event_key, note) VALUES ($1, 'reserved')"
	v.insertBizBatch = "INSERT INTO " + schema + ".reservations (event_key, note) SELECT k, 'reserved' FROM unnest(string_to_array($1, ',')) AS k"
	v.claimSQL = "INSERT INTO " + schema + ".inbox_by_hand (consumer, event_key, processed_at) VALUES ($1, $2, now()) ON CONFLICT DO NOTHING"
	handler := func(msg *message.Message) ([]*message.Message, error) {
		tx := sluicesql.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), v.insertBiz, msg.Metadata.Get(sluice.EventIDKey))
		return nil, err
	}
	for _, c := range []struct {
		table        string
		claimTimeout time.Duration
		mw           *message.HandlerFunc
	}{{"inbox", 0, &v.mw}, {"inbox_no_lock", -1, &v.mwNoLock}} {
		store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + "." + c.table})
		if err != nil {
			return nil, err
		}
		if err := store.CreateTable(ctx); err != nil {
			return nil, err
		}
		d, err := deduplication.New(deduplication.Config{Store: store, Consumer: "inventory", ClaimTimeout: c.claimTimeout, Env: sluice.Env{MeterProvider: noop.NewMeterProvider()}})
		if err != nil {
			return nil, err
		}
		*c.mw = d(handler)
		if c.claimTimeout == 0 {
			v.store = store
		}
	}
	return v, nil
}

func (v *inboxVariants) truncate(ctx context.Context) error {
	_, err := v.db.ExecContext(ctx, "TRUNCATE "+v.schema+".reservations, "+v.schema+".inbox_by_hand, "+v.schema+".inbox, "+v.schema+".inbox_no_lock")
	return err
}

func (v *inboxVariants) plain(run string) Op {
	return func(ctx context.Context, i int) error { return v.plainKey(ctx, run+strconv.Itoa(i)) }
}

func (v *inboxVariants) byHand(run string) Op {
	return func(ctx context.Context, i int) error { return v.byHandKey(ctx, run+strconv.Itoa(i)) }
}

// plainKey is the business INSERT in a transaction of its own.
func (v *inboxVariants) plainKey(ctx context.Context, key string) error {
	tx, err := v.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, v.insertBiz, key); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// byHandKey is the inbox written by hand: claim and business INSERT in one
// transaction, the business INSERT skipped for a duplicate.
func (v *inboxVariants) byHandKey(ctx context.Context, key string) error {
	tx, err := v.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	res, err := tx.ExecContext(ctx, v.claimSQL, "inventory", key)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err // a duplicate: nothing to do
	}
	if _, err := tx.ExecContext(ctx, v.insertBiz, key); err != nil {
		return err
	}
	return tx.Commit()
}

// savepointClaimer is a unit of work whose claim can follow a savepoint in
// one round trip (the SQL inbox's, on lib/pq): what group commit claims
// through.
type savepointClaimer interface {
	unitofwork.Savepointer
	ClaimAfter(ctx context.Context, release, savepoint, consumer, key string, wait time.Duration) (bool, error)
}

// batchOf is op i: a batch of size deliveries (keys i*size ...) in one
// transaction, with the statements group commit sends: per delivery the
// store's ClaimAfter (the savepoint before released, the next one set, the
// claim, its wait bounded as a batched claim's) and the business INSERT,
// then the last savepoint released and COMMIT. A claim that ran out of its
// wait (a lock it waited for, though no other transaction claims its key:
// the table's extension lock) is counted in timedOut, rolled back to its
// savepoint and made again without a bound. Without savepoints: the claims
// and INSERTs alone, then COMMIT.
func (v *inboxVariants) batchOf(run string, size int, savepoints bool, timedOut *atomic.Int64) Op {
	return func(ctx context.Context, i int) error {
		tx, err := v.store.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
		sc, ok := tx.(savepointClaimer)
		if !ok {
			return fmt.Errorf("the store's units of work cannot claim after a savepoint (ClaimAfter)")
		}
		if !savepoints {
			for j := range size {
				key := run + strconv.Itoa(i*size+j)
				if claimed, err := tx.Claim(ctx, "inventory", key); err != nil || !claimed {
					return errors.Join(err, fmt.Errorf("%s: not claimed", key))
				}
				if _, err := sluicesql.TxOf(tx).ExecContext(ctx, v.insertBiz, key); err != nil {
					return err
				}
			}
			return tx.Commit(ctx)
		}
		release := ""
		for j := range size {
			key := run + strconv.Itoa(i*size+j)
			sp := "sluice_" + strconv.Itoa(j)
			claimed, err := sc.ClaimAfter(ctx, release, sp, "inventory", key, time.Millisecond)
			if errors.Is(err, deduplication.ErrClaimInProgress) {
				timedOut.Add(1)
				if err := sc.RollbackTo(ctx, sp); err != nil {
					return err
				}
				claimed, err = tx.Claim(ctx, "inventory", key)
			}
			if err != nil {
				return err
			}
			if !claimed {
				return fmt.Errorf("%s: claimed before", key)
			}
			if _, err := sluicesql.TxOf(tx).ExecContext(ctx, v.insertBiz, key); err != nil {
				return err
			}
			release = sp
		}
		if err := sc.Release(ctx, release); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

func (v *inboxVariants) sluice(mw message.HandlerFunc) func(run string) Op {
	return func(run string) Op {
		return func(ctx context.Context, i int) error {
			msg := message.NewMessage(strconv.Itoa(i), nil)
			msg.Metadata.Set(sluice.EventIDKey, run+strconv.Itoa(i))
			msg.SetContext(ctx)
			_, err := mw(msg)
			return err
		}
	}
}

func f0(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }
func f1(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }
func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
