package poison_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/poison"
)

// sizeError is a copy over a broker's size limit by excess bytes, as
// rabbitmq.FrameSizeError says it.
type sizeError struct{ excess int }

func (e sizeError) Error() string { return fmt.Sprintf("over the frame by %d bytes", e.excess) }
func (e sizeError) Excess() int   { return e.excess }

// framed is a publisher that carries at most limit bytes of metadata
// (names and values): the first copy it sees, less over, sets the limit.
type framed struct {
	over, limit, calls int
	got                *message.Message
}

func size(md message.Metadata) int {
	n := 0
	for k, v := range md {
		n += len(k) + len(v)
	}
	return n
}

func (f *framed) Publish(_ string, msgs ...*message.Message) error {
	f.calls++
	n := size(msgs[0].Metadata)
	if f.limit == 0 {
		f.limit = n - f.over
	}
	if n > f.limit {
		return fmt.Errorf("publishing: %w", &sluice.UnpublishableError{Err: sizeError{n - f.limit}})
	}
	f.got = msgs[0].Copy()
	return nil
}

func (f *framed) Close() error { return nil }

func fitStage(t *testing.T, pub message.Publisher) message.HandlerMiddleware {
	t.Helper()
	mw, err := poison.New(poison.Config{Publisher: pub, Topic: "orders.poison", Queue: "orders", DisablePark: true})
	require.NoError(t, err)
	return mw
}

// Issue 18 item 3: a copy too large for the broker by less than its own
// reason can give is cut there, the reason first: the producer's headers
// stay whole.
func TestTooLargeCopyCutsItsOwnReasonFirst(t *testing.T) {
	t.Parallel()
	pub := &framed{over: 300}
	m := message.NewMessage("u", []byte("{}"))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	m.Metadata.Set("blob", strings.Repeat("b", 5000))
	require.NoError(t, run(fitStage(t, pub), m, sluice.Poison(errors.New(strings.Repeat("reason ", 200)))))
	require.NotNil(t, pub.got, "the copy reached the poison queue")
	md := pub.got.Metadata
	require.Equal(t, strings.Repeat("b", 5000), md.Get("blob"), "the producer's header is whole")
	require.Empty(t, md.Get(metakeys.PoisonDropped))
	reason := md.Get(metakeys.PoisonReason)
	require.True(t, strings.HasSuffix(reason, "…"), "the reason is marked as cut")
	require.Less(t, len(reason), 1024-300)
	require.Greater(t, len(reason), 128)
	require.LessOrEqual(t, size(md), pub.limit)
	require.Equal(t, "poison", md.Get(metakeys.PoisonClass))
	require.Equal(t, 2, pub.calls)
}

// When the reason cannot give enough, the largest header not of the
// diagnosis is left out and named; the reason stays whole.
func TestTooLargeCopyLeavesOutTheLargestHeader(t *testing.T) {
	t.Parallel()
	pub := &framed{over: 2000}
	m := message.NewMessage("u", []byte("{}"))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	m.Metadata.Set("blob", strings.Repeat("b", 130_000))
	m.Metadata.Set("small", "kept")
	herr := errors.New(strings.Repeat("reason ", 100))
	require.NoError(t, run(fitStage(t, pub), m, sluice.Poison(herr)))
	require.NotNil(t, pub.got)
	md := pub.got.Metadata
	require.NotContains(t, md, "blob")
	require.Equal(t, "blob", md.Get(metakeys.PoisonDropped))
	require.Equal(t, "kept", md.Get("small"))
	require.Equal(t, "poison: "+herr.Error(), md.Get(metakeys.PoisonReason), "the reason is whole")
	require.Equal(t, "evt-1", md.Get(sluice.EventIDKey))
	require.LessOrEqual(t, size(md), pub.limit)
}

// Ten thousand small headers near the limit, and a limit below what even
// the diagnosis takes: the stage converges within its bounded tries to a
// bare diagnosis, never a nack.
func TestTooLargeCopyConvergesToABareDiagnosis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		over  func(md message.Metadata) int
		small bool // some small headers stay
	}{
		{"many small headers", func(message.Metadata) int { return 3000 }, true},
		{"only a bare diagnosis fits", func(md message.Metadata) int { return size(md) - 700 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := message.NewMessage("u", []byte("{}"))
			m.Metadata.Set(sluice.EventIDKey, strings.Repeat("e", 4000))
			for i := range 10_000 {
				m.Metadata.Set(fmt.Sprintf("h%05d", i), "v")
			}
			probe := &framed{over: 0}
			require.NoError(t, run(fitStage(t, probe), m, sluice.Poison(errors.New(strings.Repeat("r", 2000)))))
			pub := &framed{over: tc.over(probe.got.Metadata)}
			require.NoError(t, run(fitStage(t, pub), m, sluice.Poison(errors.New(strings.Repeat("r", 2000)))))
			require.NotNil(t, pub.got, "isolated, not nacked")
			md := pub.got.Metadata
			require.LessOrEqual(t, size(md), pub.limit)
			require.Equal(t, "poison", md.Get(metakeys.PoisonClass))
			require.NotEmpty(t, md.Get(metakeys.PoisonReason))
			require.NotEmpty(t, md.Get(metakeys.PoisonDropped))
			small := 0
			for k := range md {
				if strings.HasPrefix(k, "h0") {
					small++
				}
			}
			require.Equal(t, tc.small, small > 0, "%d small headers stay", small)
			require.LessOrEqual(t, pub.calls, 9, "bounded tries")
		})
	}
}
