// Package outboxtest is the conformance suite of an outbox store: the
// outbox.Writer a handler's produced messages go through, in the inbox's
// unit of work, and the outbox.Store the Relay reads. Sluice's SQL store
// (PostgreSQL, SQLite) runs it, and so should a store written elsewhere:
//
//	func TestMyOutbox(t *testing.T) {
//		outboxtest.Run(t, func(t *testing.T) outboxtest.Stores {
//			in, out := newIsolatedStores(t) // fresh tables on one database
//			return outboxtest.Stores{Inbox: in, Outbox: out}
//		})
//	}
package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/unitofwork"
)

// Outbox is what a store under test is: the Writer handlers write through
// and the Store the Relay reads.
type Outbox interface {
	outbox.Writer
	outbox.Store
}

// Stores are an inbox store and the outbox store that writes in its units
// of work, sharing records with no other call.
type Stores struct {
	Inbox  deduplication.Store
	Outbox Outbox
}

// NewStores returns stores of t's own, cleaned up by t.Cleanup.
type NewStores func(t *testing.T) Stores

// Run runs the suite against the stores newStores returns. Each subtest
// gets its own and runs in parallel with the others.
func Run(t *testing.T, newStores NewStores) {
	t.Helper()
	for name, fn := range map[string]func(*testing.T, Stores){
		"WrittenWithTheCommit":              testWrittenWithTheCommit,
		"RolledBackWithTheDelivery":         testRolledBackWithTheDelivery,
		"RefusedOutsideAUnitOfWork":         testRefusedOutsideAUnitOfWork,
		"FinishDeletesAndRecords":           testFinishDeletesAndRecords,
		"AnUncountedFailureSpendsNoAttempt": testAnUncountedFailureSpendsNoAttempt,
		"EachFailureIsRecordedAsItsOwn":     testEachFailureIsRecordedAsItsOwn,
		"ReleaseGivesTheRowsBack":           testReleaseGivesTheRowsBack,
		"ConcurrentBatchesShareNoRow":       testConcurrentBatchesShareNoRow,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newStores(t))
		})
	}
}

var errHandler = errors.New("outboxtest: the handler failed")

// deliver runs one delivery of key through the inbox stage on s.Inbox; its
// handler writes msgs to topic through s.Outbox and returns fail.
func deliver(t *testing.T, s Stores, key, topic string, fail error, msgs ...*message.Message) error {
	t.Helper()
	mw, err := deduplication.New(deduplication.Config{Store: s.Inbox, Consumer: "outboxtest"})
	require.NoError(t, err)
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		if err := s.Outbox.Publish(msg.Context(), topic, msgs...); err != nil {
			return nil, err
		}
		return nil, fail
	})
	m := message.NewMessage("delivery-"+key, nil)
	m.Metadata.Set(sluice.EventIDKey, key)
	m.SetContext(t.Context())
	_, err = h(m)
	return err
}

func stats(t *testing.T, s Stores) outbox.Stats {
	t.Helper()
	st, err := s.Outbox.Stats(t.Context())
	require.NoError(t, err)
	return st
}

// testWrittenWithTheCommit: the rows of a committed delivery are due,
// oldest first, with their topic, payload and metadata byte for byte; a
// message without a UUID or an event id gets both at write time.
func testWrittenWithTheCommit(t *testing.T, s Stores) {
	with := message.NewMessage("uuid-1", []byte(`{"a":1}`))
	with.Metadata.Set(sluice.EventIDKey, "evt-1")
	with.Metadata.Set("k", "v\x00\n\"")
	without := message.NewMessage("", nil)
	require.NoError(t, deliver(t, s, "k1", "orders.created", nil, with, without))
	require.NotEmpty(t, without.UUID, "a message id is given at write time")
	require.Equal(t, without.UUID, without.Metadata.Get(sluice.EventIDKey), "so is an event id")
	st := stats(t, s)
	require.Equal(t, int64(2), st.Pending)
	require.Zero(t, st.Failing)
	require.WithinDuration(t, time.Now(), st.Oldest, time.Minute)

	b, err := s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	rows := b.Rows()
	require.Len(t, rows, 2)
	require.Less(t, rows[0].ID, rows[1].ID, "oldest first")
	require.Equal(t, "orders.created", rows[0].Topic)
	require.Equal(t, "uuid-1", rows[0].Message.UUID)
	require.Equal(t, `{"a":1}`, string(rows[0].Message.Payload))
	require.Equal(t, "evt-1", rows[0].Message.Metadata.Get(sluice.EventIDKey))
	require.Equal(t, "v\x00\n\"", rows[0].Message.Metadata.Get("k"), "metadata round-trips byte for byte")
	require.Equal(t, without.UUID, rows[1].Message.UUID)
	require.NoError(t, b.Finish(t.Context(), []int64{rows[0].ID, rows[1].ID}, nil))
	require.Equal(t, outbox.Stats{}, stats(t, s), "relayed rows are deleted")
}

// testRolledBackWithTheDelivery: a delivery that fails writes nothing.
func testRolledBackWithTheDelivery(t *testing.T, s Stores) {
	err := deliver(t, s, "k1", "orders.created", sluice.Transient(errHandler), message.NewMessage("uuid-1", nil))
	require.ErrorIs(t, err, errHandler)
	require.Zero(t, stats(t, s).Pending, "rolled back with the claim")
	require.NoError(t, deliver(t, s, "k1", "orders.created", nil, message.NewMessage("uuid-2", nil)), "the key was released")
	require.Equal(t, int64(1), stats(t, s).Pending)
}

// testRefusedOutsideAUnitOfWork: Publish without the inbox's unit of work
// writes nothing and says so.
func testRefusedOutsideAUnitOfWork(t *testing.T, s Stores) {
	err := s.Outbox.Publish(context.Background(), "orders.created", message.NewMessage("uuid-1", nil))
	require.ErrorIs(t, err, unitofwork.ErrMissing)
	require.Zero(t, stats(t, s).Pending)
}

// testFinishDeletesAndRecords: Finish deletes the relayed rows and keeps a
// failed one with its attempt, not due before its next attempt.
func testFinishDeletesAndRecords(t *testing.T, s Stores) {
	require.NoError(t, deliver(t, s, "k1", "t", nil, message.NewMessage("a", nil), message.NewMessage("b", nil)))
	b, err := s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	rows := b.Rows()
	require.Len(t, rows, 2)
	require.NoError(t, b.Finish(t.Context(), []int64{rows[0].ID}, []outbox.Failed{{ID: rows[1].ID, Err: "returned: no route", NextAttempt: time.Now().Add(time.Hour)}}))
	st := stats(t, s)
	require.Equal(t, int64(1), st.Pending, "the relayed row is deleted, the failed one kept")
	require.Equal(t, int64(1), st.Failing)
	b, err = s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	require.Empty(t, b.Rows(), "a failed row waits for its next attempt")
	require.NoError(t, b.Release(t.Context()))
}

// testAnUncountedFailureSpendsNoAttempt: Finish records a failure the relay
// does not count (Failed.Uncounted: no broker answered) with its error and
// its next attempt, and leaves the row's attempts as they were; a counted
// one adds one.
func testAnUncountedFailureSpendsNoAttempt(t *testing.T, s Stores) {
	require.NoError(t, deliver(t, s, "k1", "t", nil, message.NewMessage("a", nil)))
	// fail takes the row, checks its attempts and records a failure due at once.
	fail := func(attempts int, uncounted bool) {
		t.Helper()
		b, err := s.Outbox.Due(t.Context(), 10, 0)
		require.NoError(t, err)
		require.Len(t, b.Rows(), 1, "the failed row is due again at its next attempt")
		require.Equal(t, attempts, b.Rows()[0].Attempts)
		require.NoError(t, b.Finish(t.Context(), nil, []outbox.Failed{{ID: b.Rows()[0].ID, Err: "dial tcp: connection refused", NextAttempt: time.Now(), Uncounted: uncounted}}))
		require.Equal(t, int64(1), stats(t, s).Failing, "recorded as failing")
	}
	fail(0, true)
	fail(0, true)  // two failures no broker answered: no attempt spent
	fail(0, false) // a counted one adds one
	b, err := s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	require.Len(t, b.Rows(), 1)
	require.Equal(t, 1, b.Rows()[0].Attempts)
	require.NoError(t, b.Finish(t.Context(), []int64{b.Rows()[0].ID}, nil))
}

// testEachFailureIsRecordedAsItsOwn: one Finish of failures alike and
// not — the same error and next attempt counted and not, another error, a
// later next attempt, a dead row — records each row's own: a store may
// record rows that failed alike together, never one row as another.
func testEachFailureIsRecordedAsItsOwn(t *testing.T, s Stores) {
	msgs := make([]*message.Message, 7)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("m%d", i), nil)
	}
	require.NoError(t, deliver(t, s, "k1", "t", nil, msgs...))
	b, err := s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	rows := b.Rows()
	require.Len(t, rows, 7)
	now, later := time.Now(), time.Now().Add(time.Hour)
	const refused = "dial tcp: connection refused"
	require.NoError(t, b.Finish(t.Context(), []int64{rows[6].ID}, []outbox.Failed{
		{ID: rows[0].ID, Err: refused, NextAttempt: now, Uncounted: true},
		{ID: rows[1].ID, Err: refused, NextAttempt: now, Uncounted: true},
		{ID: rows[2].ID, Err: refused, NextAttempt: now},
		{ID: rows[3].ID, Err: "returned: no route", NextAttempt: now},
		{ID: rows[4].ID, Err: refused, NextAttempt: later},
		{ID: rows[5].ID, Err: refused, NextAttempt: now, Dead: true},
	}))
	require.Equal(t, outbox.Stats{Pending: 5, Failing: 5, Dead: 1}, withoutOldest(stats(t, s)))
	b, err = s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	attempts := map[string]int{}
	for _, r := range b.Rows() {
		attempts[r.Message.UUID] = r.Attempts
	}
	require.Equal(t, map[string]int{"m0": 0, "m1": 0, "m2": 1, "m3": 1}, attempts,
		"due again: the four due now, each with its own attempts; not the row due in an hour, nor the dead one")
	require.NoError(t, b.Release(t.Context()))
}

// withoutOldest is st without the oldest row's time and age.
func withoutOldest(st outbox.Stats) outbox.Stats {
	st.Oldest, st.OldestAge = time.Time{}, 0
	return st
}

// testReleaseGivesTheRowsBack: a released batch is due again at once.
func testReleaseGivesTheRowsBack(t *testing.T, s Stores) {
	require.NoError(t, deliver(t, s, "k1", "t", nil, message.NewMessage("a", nil)))
	b, err := s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	require.Len(t, b.Rows(), 1)
	require.NoError(t, b.Release(t.Context()))
	b, err = s.Outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	require.Len(t, b.Rows(), 1, "released rows are due again")
	require.Zero(t, b.Rows()[0].Attempts, "a release is not a failed attempt")
	require.NoError(t, b.Finish(t.Context(), []int64{b.Rows()[0].ID}, nil))
}

// testConcurrentBatchesShareNoRow: relays taking batches at once never hold
// one row twice, and together take every row.
func testConcurrentBatchesShareNoRow(t *testing.T, s Stores) {
	const rows = 40
	for i := range rows / 4 {
		msgs := make([]*message.Message, 4)
		for j := range msgs {
			msgs[j] = message.NewMessage(fmt.Sprintf("m-%d-%d", i, j), nil)
		}
		require.NoError(t, deliver(t, s, fmt.Sprint("k", i), "t", nil, msgs...))
	}
	var mu sync.Mutex
	seen := map[int64]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				b, err := s.Outbox.Due(t.Context(), 3, 0)
				if !assertNoError(t, err) {
					return
				}
				if len(b.Rows()) == 0 {
					_ = b.Release(t.Context())
					return
				}
				ids := make([]int64, 0, len(b.Rows()))
				mu.Lock()
				for _, r := range b.Rows() {
					seen[r.ID]++
					ids = append(ids, r.ID)
				}
				mu.Unlock()
				if !assertNoError(t, b.Finish(t.Context(), ids, nil)) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, rows, "every row taken")
	for id, n := range seen {
		require.Equal(t, 1, n, "row %d taken %d times", id, n)
	}
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("outboxtest: %v", err)
		return false
	}
	return true
}
