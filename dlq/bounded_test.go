package dlq_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"

	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

// A scan whose broker goes silent in the middle of it — the connection up,
// its basic.get never answered, as from a frozen host — fails CallTimeout
// after the get, naming it, where it waited for the AMQP heartbeat to give
// the connection up (three heartbeats: 30 s by default) with an error that
// said only "i/o timeout" — or, without heartbeats, for ever; the broker
// gives back every message the scan held.
func TestABlackHoledBrokerHoldsNoScanPastCallTimeout(t *testing.T) {
	t.Parallel()
	const n = 5
	queue := testenv.Name("dlq_holed")
	testenv.DeleteQueuesAtEnd(t, queue)
	direct := testenv.AMQP(t)
	_, err := testenv.Channel(t, direct).QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for i := range n {
		require.NoError(t, pub.Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))))
	}

	proxy, url := testenv.ProxyAMQP(t)
	url += "?heartbeat=0" // no heartbeat to give the connection up: only CallTimeout bounds the get
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url}, "dlq black hole")
	require.NoError(t, err)
	t.Cleanup(func() { _ = amqpcall.Close(context.Background(), conn, time.Second) })

	read := 0
	testenv.Within(t, dlq.CallTimeout+25*time.Second, "the scan", func() {
		_, err = dlq.Scan(t.Context(), conn, queue, func(*dlq.Message) (bool, error) {
			read++
			if read == 2 {
				proxy.BlackHole() // the third get is never answered
			}
			return false, nil
		}, nil)
	})
	require.Equal(t, 2, read)
	require.True(t, errors.Is(err, amqpcall.ErrNoAnswer), "%v", err)
	require.ErrorContains(t, err, "dlq: reading "+queue+": basic.get from "+queue+": the broker gave no answer within "+dlq.CallTimeout.String())
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, direct, queue) == n }, 2*time.Minute, 50*time.Millisecond,
		"the broker gave back what the scan held")
}

// A scan over a slow link reads a message whose transfer outlasts
// CallTimeout — 3 MiB at 256 KiB/s, 12 s — as long as its frames keep
// coming, and puts it back. Before, each basic.get was bounded by a fixed
// CallTimeout, the transfer included: the scan failed with "basic.get from
// … the broker gave no answer within 10s (connection closed)", as a 4 MiB
// message did at a load average of 19-37.
func TestASlowLinkHoldsNoLargeMessageFromAScan(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("dlq_slow")
	testenv.DeleteQueuesAtEnd(t, queue)
	direct := testenv.AMQP(t)
	_, err := testenv.Channel(t, direct).QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	body := make([]byte, 3<<20)
	for i := range body {
		body[i] = byte(i * 13)
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	require.NoError(t, pub.Publish(queue, message.NewMessage(watermill.NewUUID(), body)))

	proxy, url := testenv.ProxyAMQP(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url}, "dlq slow link")
	require.NoError(t, err)
	t.Cleanup(func() { _ = amqpcall.Close(context.Background(), conn, time.Second) })
	proxy.Throttle(256 << 10)

	var got []byte
	took := testenv.Within(t, amqpcall.LimitFactor*dlq.CallTimeout, "the scan", func() {
		_, err = dlq.Scan(t.Context(), conn, queue, func(m *dlq.Message) (bool, error) {
			got = m.Delivery.Body
			return false, nil
		}, nil)
	})
	require.NoError(t, err)
	require.Equal(t, body, got)
	require.Greater(t, took, dlq.CallTimeout, "the transfer outlasted CallTimeout (the throttle's doing), or the test shows nothing")
	require.Equal(t, 1, testenv.QueueDepth(t, direct, queue), "the scan put the message back")
}

// The outcome records on a database that went silent — the connection up,
// nothing coming back — hold no closed loop's wait for the outcomes past
// CallTimeout, and the error names the call; before, AwaitOutcomes's reads
// had no bound but the command's context, which does not end by itself.
// (The opening of the records, which the CLI does, is
// cmd/sluice's TestABlackHoledDatabaseHoldsNoOutcomeOpenPastItsBound.)
func TestABlackHoledDatabaseHoldsNoOutcomeReadPastCallTimeout(t *testing.T) {
	t.Parallel()
	schema := testenv.Schema(t, testenv.Postgres(t))
	table := schema + ".outcomes"
	proxy, dsn := testenv.ProxyPostgresURL(t)
	db, err := postgres.Open(postgres.Config{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateTable(t.Context()))

	proxy.BlackHole()
	bound := dlq.CallTimeout + 5*time.Second
	took := testenv.Within(t, bound+25*time.Second, "AwaitOutcomes", func() {
		_, err = dlq.AwaitOutcomes(context.Background(), store, "run-1", map[string]bool{"e1": true}, time.Minute)
	})
	require.Less(t, took, bound, "AwaitOutcomes")
	require.ErrorContains(t, err, "reading the outcomes: the outcome records: no answer within "+dlq.CallTimeout.String())
}

// An archive table on a database that went silent holds neither a
// restore's next row nor an archive's insert past CallTimeout (and the
// pool's CancelGrace) — a new connection's start-up, its connect_timeout
// (5 s) — each error naming the call; before, the command's context, which
// does not end by itself, was their only bound, and the restore's BEGIN
// ran on a context that never ends.
func TestABlackHoledDatabaseHoldsNoArchiveTablePastCallTimeout(t *testing.T) {
	t.Parallel()
	schema := testenv.Schema(t, testenv.Postgres(t))
	table := schema + ".archive"
	proxy, dsn := testenv.ProxyPostgresURL(t)
	db, err := postgres.Open(postgres.Config{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	sink, err := dlq.NewTableSink(t.Context(), db, table)
	require.NoError(t, err)
	rec := dlq.ArchiveRecord{ArchivedAt: time.Now().UTC(), ArchivedBy: "tester", Queue: "q.poison", UUID: watermill.NewUUID(), EventID: "e1", Class: "poison"}
	require.NoError(t, sink.Write(t.Context(), rec))
	src, err := dlq.OpenTableSource(t.Context(), db, table, "tester", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })

	proxy.BlackHole()
	bound := dlq.CallTimeout + 5*time.Second
	// The next row's BEGIN first, on the pool's idle connection; then the
	// insert, on a new one (the pool drops its idle connections after a
	// failure: they may be stalled too), whose start-up the pool's
	// connect_timeout bounds.
	for _, c := range []struct {
		what, says string
		f          func() error
	}{
		{"the next row", "dlq: reading the archive table: BEGIN: no answer within " + dlq.CallTimeout.String(), func() error {
			_, _, err := src.Next(context.Background())
			return err
		}},
		{"the insert", "dlq: writing the archive table: ", func() error {
			rec.UUID = watermill.NewUUID()
			return sink.Write(context.Background(), rec)
		}},
	} {
		ch := make(chan error, 1)
		start := time.Now()
		go func() { ch <- c.f() }()
		select {
		case err := <-ch:
			require.Less(t, time.Since(start), bound, c.what)
			require.ErrorContains(t, err, c.says, c.what)
			t.Logf("%s on the silent database: %v", c.what, err)
		case <-time.After(bound + 25*time.Second):
			t.Fatalf("%s did not return within %s", c.what, bound+25*time.Second)
		}
	}
}
