package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestExampleEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := run(ctx, filepath.Join(t.TempDir(), "orders.db"))
	require.NoError(t, err)

	require.Equal(t, []string{"o-1", "o-2", "o-3", "o-5"}, s.Reserved, "each accepted order reserved exactly once, o-3 after its timeout")
	require.Equal(t, []string{"o-4"}, s.Rejected)
	require.Equal(t, 5, s.InboxRows)
	require.Equal(t, int64(2), s.Duplicates)

	var out bytes.Buffer
	s.print(&out)
	require.Contains(t, out.String(), "duplicates skipped (sluice.inbox.duplicates)  2")
}
