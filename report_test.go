package sluice_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
)

// Settle is the one place a delivery's fate is decided: what reached the
// router wins over what a stage recorded, a stage's record stands on
// success, and settling twice changes nothing (the replay stage settles
// inside the Trace stage, which settles again).
func TestReportSettle(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tt := range []struct {
		recorded sluice.Outcome
		err      error
		want     sluice.Outcome
		class    sluice.Class
	}{
		{"", nil, sluice.OutcomeProcessed, 0},
		{sluice.OutcomeDuplicate, nil, sluice.OutcomeDuplicate, 0},
		{sluice.OutcomeRetried, nil, sluice.OutcomeRetried, 0},
		{sluice.OutcomePoisoned, nil, sluice.OutcomePoisoned, 0},
		{"", fmt.Errorf("wrapped: %w", sluice.ErrHeld), sluice.OutcomeHeld, 0},
		{"", sluice.ErrShutdown, sluice.OutcomeRequeued, 0},
		{sluice.OutcomeRetried, sluice.Transient(boom), sluice.OutcomeFailed, sluice.ClassTransient},
		{"", sluice.Poison(boom), sluice.OutcomeFailed, sluice.ClassPoison},
	} {
		r := &sluice.Report{Outcome: tt.recorded}
		require.Equal(t, tt.want, r.Settle(tt.err), "recorded %q, err %v", tt.recorded, tt.err)
		require.Equal(t, tt.want, r.Settle(tt.err), "settling again")
		if tt.err != nil && tt.want == sluice.OutcomeFailed {
			require.Equal(t, tt.class, r.Class)
		}
	}
}
