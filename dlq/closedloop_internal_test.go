package dlq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A closed loop whose Loop names no place for its records (a console
// mounted without Config.OutcomesWhere, as docs/console.md mounts it)
// words its stop without one: it said "recording into  of --outcomes?".
func TestAStopWithoutAPlaceForTheRecordsReadsWhole(t *testing.T) {
	t.Parallel()
	items := map[string]bool{"e1": true, "e2": true}
	for _, where := range []string{"", "table public.sluice_replay"} {
		b := judge(Loop{Wait: 2 * time.Second, Where: where}, "ramp", 0, 2, 2, items, nil)
		require.NotContains(t, b.Stopped, "  ", where)
		require.Contains(t, b.Stopped, "no outcome recorded within --wait 2s for any of the 2 events: does the consumer run the replay stage (router.Stages.Replay) recording into ", where)
		if where == "" {
			require.Contains(t, b.Stopped, "recording into the outcome records this replay reads? (a service.New with Config.Schema S records into S.sluice_replay)")
		} else {
			require.Contains(t, b.Stopped, "recording into table public.sluice_replay of --outcomes? (a service.New with Config.Schema S records into --outcomes-table S.sluice_replay)")
		}
	}
}
