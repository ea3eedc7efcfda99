package deduplication_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// bundle is what each inbox test works with: its own schema holding the inbox
// and a business table without any unique constraint, so a double effect
// shows as a second row.
type bundle struct {
	db      *sqlx.DB
	schema  string
	store   *sluicesql.Inbox
	reader  *sdkmetric.ManualReader
	meter   *sdkmetric.MeterProvider
	handled atomic.Int64
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s.reservations (event_key TEXT NOT NULL, note TEXT NOT NULL)`, schema))
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	return &bundle{
		db:     db,
		schema: schema,
		store:  testenv.SQLStore(t, db, schema+".inbox"),
		reader: reader,
		meter:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	}
}

func (b *bundle) dedup(t *testing.T, consumer string) message.HandlerMiddleware {
	t.Helper()
	d, err := deduplication.New(deduplication.Config{Store: b.store, Consumer: consumer, Env: sluice.Env{MeterProvider: b.meter}})
	require.NoError(t, err)
	return d
}

// reserve is a handler that writes one business row in the inbox transaction
// and then returns ret.
func (b *bundle) reserve(ret error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		b.handled.Add(1)
		tx := sluicesql.TxFromContext(msg.Context())
		if tx == nil {
			return nil, errors.New("no inbox transaction in the context")
		}
		_, err := tx.ExecContext(msg.Context(),
			fmt.Sprintf(`INSERT INTO %s.reservations (event_key, note) VALUES ($1, 'reserved')`, b.schema),
			msg.Metadata.Get(sluice.EventIDKey))
		if err != nil {
			return nil, err
		}
		return nil, ret
	}
}

func (b *bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Get(&n, fmt.Sprintf(query, b.schema), args...))
	return n
}

func (b *bundle) rows(t *testing.T) (business, inbox int) {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM %s.reservations`), b.count(t, `SELECT count(*) FROM %s.inbox`)
}

func (b *bundle) duplicates(t *testing.T) int64 {
	t.Helper()
	return testenv.CounterSum(t, b.reader, telemetry.MetricInboxDuplicates)
}

// event is a fresh delivery (its own Watermill UUID) of the event with id key.
func event(key string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
	msg.Metadata.Set(sluice.EventIDKey, key)
	return msg
}

func TestInboxConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.dedup(t, "inventory")(b.reserve(nil))

	const keys, copies, workers = 1000, 8, 16
	deliveries := make([]string, 0, keys*copies)
	for k := range keys {
		for range copies {
			deliveries = append(deliveries, fmt.Sprint("evt-", k))
		}
	}
	rand.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })

	next := atomic.Int64{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(deliveries)); i = next.Add(1) - 1 {
				if _, err := h(event(deliveries[i])); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	business, inbox := b.rows(t)
	require.Equal(t, keys, business, "exactly one business row per event")
	require.Equal(t, keys, inbox)
	require.Equal(t, keys, b.count(t, `SELECT count(DISTINCT event_key) FROM %s.reservations`))
	require.Equal(t, int64(keys), b.handled.Load(), "the handler ran once per event")
	require.Equal(t, int64(keys*(copies-1)), b.duplicates(t))
}

func TestInboxRollbackLetsWaitingDeliveryProceed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.dedup(t, "inventory")

	release := make(chan struct{})
	first := d(func(msg *message.Message) ([]*message.Message, error) {
		if _, err := b.reserve(nil)(msg); err != nil {
			return nil, err
		}
		<-release
		return nil, sluice.Transient(errors.New("stock service timed out"))
	})
	firstErr := make(chan error, 1)
	go func() { _, err := first(event("evt-1")); firstErr <- err }()
	require.Eventually(t, func() bool { return b.handled.Load() == 1 }, time.Minute, 5*time.Millisecond)

	secondErr := make(chan error, 1)
	go func() { _, err := d(b.reserve(nil))(event("evt-1")); secondErr <- err }()
	// The second delivery waits on the inbox's primary key, held by the first.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO "%s"."inbox"%%'`) == 1
	}, time.Minute, 5*time.Millisecond, "the second claim does not wait on the first")
	require.Equal(t, int64(1), b.handled.Load(), "the second handler must not run while the first holds the key")

	close(release)
	require.Equal(t, sluice.ClassTransient, sluice.ClassOf(<-firstErr))
	require.NoError(t, <-secondErr)
	require.Equal(t, int64(2), b.handled.Load(), "after the rollback the second delivery runs the handler")
	business, inbox := b.rows(t)
	require.Equal(t, 1, business)
	require.Equal(t, 1, inbox)
}

func TestInboxRedeliveryAfterCommitSkipsHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.dedup(t, "inventory")(b.reserve(nil))

	_, err := h(event("evt-1"))
	require.NoError(t, err)
	// The ack was lost: the broker delivers the same event again.
	produced, err := h(event("evt-1"))
	require.NoError(t, err, "a duplicate is acked")
	require.Empty(t, produced)
	require.Equal(t, int64(1), b.handled.Load(), "the handler did not run for the redelivery")
	business, _ := b.rows(t)
	require.Equal(t, 1, business)
	require.Equal(t, int64(1), b.duplicates(t))
}

func TestInboxRejectedCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	classify, err := stage.Classify(stage.ClassifyConfig{})
	require.NoError(t, err)
	h := classify(b.dedup(t, "inventory")(b.reserve(sluice.Reject(errors.New("out of stock")))))

	_, err = h(event("evt-1"))
	require.NoError(t, err, "a rejection is acked")
	business, inbox := b.rows(t)
	require.Equal(t, 1, business, "the handler's record of the rejection is committed")
	require.Equal(t, 1, inbox)

	_, err = h(event("evt-1"))
	require.NoError(t, err)
	require.Equal(t, int64(1), b.handled.Load(), "a rejected event is not processed again")
}

func TestInboxTransientRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.dedup(t, "inventory")

	_, err := d(b.reserve(errors.New("payment API: 503")))(event("evt-1"))
	require.Error(t, err)
	business, inbox := b.rows(t)
	require.Zero(t, business, "the business write is rolled back")
	require.Zero(t, inbox, "the inbox claim is rolled back")

	_, err = d(b.reserve(nil))(event("evt-1"))
	require.NoError(t, err)
	require.Equal(t, int64(2), b.handled.Load(), "the redelivery runs the handler again")
	business, inbox = b.rows(t)
	require.Equal(t, 1, business)
	require.Equal(t, 1, inbox)
}

func TestInboxSameEventTwoConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inventory := b.dedup(t, "inventory")(b.reserve(nil))
	billing := b.dedup(t, "billing")(b.reserve(nil))

	for range 3 {
		for _, h := range []message.HandlerFunc{inventory, billing} {
			_, err := h(event("evt-1"))
			require.NoError(t, err)
		}
	}
	business, inbox := b.rows(t)
	require.Equal(t, 2, business, "processed once by each consumer")
	require.Equal(t, 2, inbox)
}

func TestInboxCommitFailureIsTransient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A deferred constraint makes the real COMMIT fail.
	_, err := b.db.Exec(fmt.Sprintf(`ALTER TABLE %s.reservations ADD CONSTRAINT one_note UNIQUE (note) DEFERRABLE INITIALLY DEFERRED`, b.schema))
	require.NoError(t, err)
	twice := func(msg *message.Message) ([]*message.Message, error) {
		if _, err := b.reserve(nil)(msg); err != nil {
			return nil, err
		}
		return b.reserve(nil)(msg)
	}

	_, err = b.dedup(t, "inventory")(twice)(event("evt-1"))
	require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err), "a failed commit is transient: %v", err)
	require.ErrorContains(t, err, "deduplication: commit")
	business, inbox := b.rows(t)
	require.Zero(t, business)
	require.Zero(t, inbox, "no inbox row: the redelivery will run the handler")
}

func TestInboxPanicRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.dedup(t, "inventory")(func(msg *message.Message) ([]*message.Message, error) {
		_, _ = b.reserve(nil)(msg)
		panic("bug")
	})
	require.PanicsWithValue(t, "bug", func() { _, _ = h(event("evt-1")) })
	business, inbox := b.rows(t)
	require.Zero(t, business)
	require.Zero(t, inbox)
}

func TestInboxBadKeyIsPoison(t *testing.T) {
	t.Parallel()
	store := deduplication.NewMemoryStore()
	handled := 0
	handler := func(*message.Message) ([]*message.Message, error) { handled++; return nil, nil }

	tests := []struct {
		name    string
		key     sluice.KeyFunc
		msg     *message.Message
		wantErr string
	}{
		{"no metadata", nil, message.NewMessage(watermill.NewUUID(), nil), `metadata "sluice_event_id": missing`},
		{"malformed JSON", sluice.KeyFromJSON("eventId"), message.NewMessage("1", []byte(`{"eventId":`)), `JSON field "eventId": payload is not a JSON object`},
		{"field missing", sluice.KeyFromJSON("eventId"), message.NewMessage("1", []byte(`{"id":"x"}`)), `JSON field "eventId": missing`},
		{"too long", sluice.KeyFromJSON("eventId"), message.NewMessage("1", fmt.Appendf(nil, `{"eventId":"%0600d"}`, 1)), `JSON field "eventId": 600 bytes long, more than 512`},
		{"NUL", sluice.KeyFromJSON("eventId"), message.NewMessage("1", []byte(`{"eventId":"a\u0000b"}`)), `JSON field "eventId": contains a NUL byte`},
		{"prefixed NUL", sluice.KeyPrefix("p:", sluice.KeyFromMetadata("id")), withMetadata("id", "a\x00b"), `metadata "id": contains a NUL byte`},
		{"joined too long", sluice.KeyJoin(":", sluice.KeyFromMetadata("type"), sluice.KeyFromJSON("orderId")),
			withPayload(fmt.Appendf(nil, `{"orderId":"%0600d"}`, 1), "type", "t"), `metadata "type" + JSON field "orderId": 602 bytes long`},
		{"custom func", func(*message.Message) (string, error) { return "\xff\xfe", nil }, message.NewMessage("1", nil), "key function: not valid UTF-8"},
	}
	for _, tt := range tests {
		d, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c", Key: tt.key})
		require.NoError(t, err)
		_, err = d(handler)(tt.msg)
		require.Equal(t, sluice.ClassPoison, sluice.ClassOf(err), tt.name)
		require.ErrorAs(t, err, new(*sluice.KeyError), tt.name)
		require.ErrorContains(t, err, tt.wantErr, tt.name)
	}
	require.Zero(t, handled, "the handler never runs without a key")
	require.Zero(t, store.Len())
}

func TestInboxSetsEventID(t *testing.T) {
	t.Parallel()
	d, err := deduplication.New(deduplication.Config{
		Store:    deduplication.NewMemoryStore(),
		Consumer: "c",
		Key:      sluice.KeyPrefix("OrderPlaced:", sluice.KeyFromJSONInteger("orderId")),
	})
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":42}`))
	_, err = d(func(m *message.Message) ([]*message.Message, error) {
		require.Nil(t, sluicesql.TxFromContext(m.Context()), "the memory store has no SQL transaction")
		return nil, nil
	})(msg)
	require.NoError(t, err)
	require.Equal(t, "OrderPlaced:42", msg.Metadata.Get(sluice.EventIDKey))
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	store := deduplication.NewMemoryStore()
	for _, tt := range []struct {
		cfg  deduplication.Config
		want string
	}{
		{deduplication.Config{Consumer: "c"}, "Config.Store is required"},
		{deduplication.Config{Store: store}, "Config.Consumer is required"},
		{deduplication.Config{Store: store, Consumer: "  "}, "Config.Consumer is required"},
		{deduplication.Config{Store: store, Consumer: "c", KeyMaxLength: -1}, "Config.KeyMaxLength"},
	} {
		_, err := deduplication.New(tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
}

func withMetadata(kv ...string) *message.Message { return withPayload(nil, kv...) }

func withPayload(payload []byte, kv ...string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), payload)
	for i := 0; i+1 < len(kv); i += 2 {
		m.Metadata.Set(kv[i], kv[i+1])
	}
	return m
}
