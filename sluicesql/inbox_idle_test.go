package sluicesql_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql"
)

// Issue 43, item 3: a unit of work whose claim bounds its idle time
// (deduplication.IdleBounder) is ended by PostgreSQL once it sits idle
// longer — as a process stopped mid-handler leaves it — and another unit of
// work then claims the key; without the bound it would wait for as long as
// the process hangs.
func TestAnIdleUnitOfWorkIsEndedAndItsKeyFreed(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	s := testenv.SQLStore(t, db, testenv.Schema(t, db)+".inbox")
	hung, err := s.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = hung.Rollback(t.Context()) })
	claimed, err := hung.(deduplication.IdleBounder).ClaimIdle(t.Context(), "c", "k-1", 300*time.Millisecond)
	require.NoError(t, err)
	require.True(t, claimed)
	var setting string
	require.NoError(t, sluicesql.TxOf(hung).Get(&setting, `SHOW idle_in_transaction_session_timeout`))
	require.Equal(t, "300ms", setting, "for this transaction")
	// The hung unit of work says nothing more; the next claim of its key
	// waits for it, and gets the key once PostgreSQL ends it.
	next, err := s.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = next.Rollback(t.Context()) }()
	claimed, err = next.Claim(t.Context(), "c", "k-1")
	require.NoError(t, err)
	require.True(t, claimed, "the hung claim was rolled back with its session")
	require.NoError(t, next.Commit(t.Context()))
	require.Error(t, hung.Commit(t.Context()), "the hung unit of work was ended")
}
