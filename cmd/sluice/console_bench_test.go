package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// letters names group i without digits (a fingerprint replaces numbers).
func letters(i int) string {
	var b strings.Builder
	for range 3 {
		b.WriteByte(byte('a' + i%26))
		i /= 26
	}
	return b.String()
}

// rssMB is the process's peak resident set, in MiB (VmHWM).
func rssMB(tb testing.TB) float64 {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(tb, err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.Atoi(f[1])
			require.NoError(tb, err)
			return float64(kb) / 1024
		}
	}
	return 0
}

// A poison queue of 100,000 messages in 1,000 groups: the overview, the
// groups page (read, then again: its summary) and a group's page, their
// time and the process's peak RSS. SLUICE_CONSOLE_BENCH_N sets another
// size, SLUICE_CONSOLE_BENCH_QUORUM=1 a quorum topology.
// go test -run '^$' -bench BenchmarkConsoleLargePoisonQueue -benchtime 1x ./sluice/
func BenchmarkConsoleLargePoisonQueue(bm *testing.B) {
	b := newBedOn(bm, rabbitmq.TopologyConfig{Queue: testenv.Name("cli"), TierDelays: []time.Duration{time.Minute},
		Quorum: os.Getenv("SLUICE_CONSOLE_BENCH_QUORUM") == "1"})
	n, groups := 100_000, 1_000
	if v, err := strconv.Atoi(os.Getenv("SLUICE_CONSOLE_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	batch := make([]*message.Message, 0, 1000)
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"eventId":"e-%d","pad":"%s"}`, i, strings.Repeat("x", 200)))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("e-", i))
		m.Metadata.Set(metakeys.PoisonClass, "poison")
		m.Metadata.Set(metakeys.PoisonReason, fmt.Sprintf("order o-%d failed: rule %s", i, letters(i%groups)))
		m.Metadata.Set(metakeys.PoisonConsumer, "orders")
		m.Metadata.Set(metakeys.PoisonQueue, b.topo.Config().Queue)
		m.Metadata.Set(metakeys.PoisonedAt, time.Now().UTC().Format(time.RFC3339Nano))
		batch = append(batch, m)
		if len(batch) == cap(batch) {
			require.NoError(bm, b.pub.Publish(b.topo.Config().PoisonQueue, batch...))
			batch = batch[:0]
		}
	}
	base, _ := consoleOn(bm, b, "", nil)
	get := func(path string) (time.Duration, int) {
		start := time.Now()
		resp, err := http.Get(base + path)
		require.NoError(bm, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(bm, err)
		_ = resp.Body.Close()
		require.Equal(bm, http.StatusOK, resp.StatusCode, string(body[:min(len(body), 500)]))
		return time.Since(start), len(body)
	}
	group := groupOf(bm, b.topo.Config().PoisonQueue, "e-0")
	before := rssMB(bm)
	bm.ResetTimer()
	for range bm.N {
		d, _ := get("/")
		bm.ReportMetric(d.Seconds(), "overview-s")
		d, size := get("/q/" + b.topo.Config().PoisonQueue + "/groups")
		bm.ReportMetric(d.Seconds(), "groups-s")
		bm.ReportMetric(float64(size)/1024, "groups-KiB")
		d, _ = get("/q/" + b.topo.Config().PoisonQueue + "/groups")
		bm.ReportMetric(d.Seconds(), "groups-again-s") // from the summary (a minute)
		d, _ = get("/q/" + b.topo.Config().PoisonQueue + "/g/" + group + "?page=2")
		bm.ReportMetric(d.Seconds(), "group-page-s")
	}
	bm.ReportMetric(before, "rss-before-MiB")
	bm.ReportMetric(rssMB(bm), "rss-peak-MiB")
}
