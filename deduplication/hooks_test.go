package deduplication_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/unitofwork"
)

// abortingStore is a MemoryStore whose first commit fails as a PostgreSQL
// transaction aborted by an earlier statement does (ErrAborted).
type abortingStore struct {
	*deduplication.MemoryStore
	aborts int
}

type abortingTx struct {
	unitofwork.Tx
	s *abortingStore
}

func (s *abortingStore) Begin(ctx context.Context) (unitofwork.Tx, error) {
	tx, err := s.MemoryStore.Begin(ctx)
	return &abortingTx{tx, s}, err
}

func (t *abortingTx) Commit(ctx context.Context) error {
	if t.s.aborts > 0 {
		t.s.aborts--
		_ = t.Rollback(ctx)
		return unitofwork.ErrAborted
	}
	return t.Tx.Commit(ctx)
}

func runInbox(t *testing.T, store deduplication.Store, key string, h message.HandlerFunc) error {
	t.Helper()
	stage, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c"})
	require.NoError(t, err)
	msg := message.NewMessage(key, nil)
	msg.Metadata.Set(sluice.EventIDKey, key)
	msg.SetContext(context.Background())
	_, err = stage(h)(msg)
	return err
}

// OnCommit runs after a commit, never after a rollback; OnRecordAlone runs
// its write in the unit of work that records an aborted rejection's claim
// alone, and nowhere else. Outside the inbox both report false.
func TestTheUnitOfWorkHooks(t *testing.T) {
	t.Parallel()
	require.False(t, unitofwork.OnCommit(context.Background(), func() {}))
	require.False(t, unitofwork.OnRecordAlone(context.Background(), func(context.Context, unitofwork.Tx) error { return nil }))

	var commits, rewrites int
	hooks := func(result error) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			require.True(t, unitofwork.OnCommit(msg.Context(), func() { commits++ }))
			require.True(t, unitofwork.OnRecordAlone(msg.Context(), func(_ context.Context, tx unitofwork.Tx) error {
				require.NotNil(t, tx)
				rewrites++
				return nil
			}))
			return nil, result
		}
	}
	store := &abortingStore{MemoryStore: deduplication.NewMemoryStore()}
	require.NoError(t, runInbox(t, store, "ok", hooks(nil)))
	require.Equal(t, 1, commits)
	require.Zero(t, rewrites, "a commit that succeeds writes nothing again")

	require.Error(t, runInbox(t, store, "fails", hooks(sluice.Transient(errors.New("boom")))))
	require.Equal(t, 1, commits, "not after a rollback")

	store.aborts = 1
	require.Error(t, runInbox(t, store, "aborted", hooks(nil)), "a success whose commit was aborted is retried")
	require.Equal(t, 1, commits)
	require.Zero(t, rewrites)

	store.aborts = 1
	err := runInbox(t, store, "rejected", hooks(sluice.Reject(errors.New("out of stock"))))
	require.Equal(t, sluice.ClassRejected, sluice.DefaultClassifier().Classify(err))
	require.Equal(t, 1, rewrites, "the rejection's claim recorded alone carries the writes again")
	require.Equal(t, 2, commits, "and commits them")

	store.aborts = 1
	failing := func(msg *message.Message) ([]*message.Message, error) {
		unitofwork.OnRecordAlone(msg.Context(), func(context.Context, unitofwork.Tx) error { return errors.New("disk full") })
		return nil, sluice.Reject(errors.New("out of stock"))
	}
	err = runInbox(t, store, "rejected-2", failing)
	require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(err), "a write that fails again fails the delivery: retried, nothing committed")
	require.ErrorContains(t, err, "disk full")
}
