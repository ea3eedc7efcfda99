package poison_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/poison"
)

// recorder is a publisher that records what it is given, or fails with fail:
// the fault of an unreachable poison queue.
type recorder struct {
	got  []*message.Message
	fail error
}

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	if r.fail != nil {
		return r.fail
	}
	r.got = append(r.got, msgs...)
	return nil
}

func (r *recorder) Close() error { return nil }

func run(mw message.HandlerMiddleware, msg *message.Message, herr error) error {
	_, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, herr })(msg)
	return err
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := poison.New(poison.Config{Topic: "q.poison"})
	require.ErrorContains(t, err, "Config.Publisher is required")
	_, err = poison.New(poison.Config{Publisher: &recorder{}})
	require.ErrorContains(t, err, "Config.Topic is required")
	_, err = poison.New(poison.Config{Publisher: &recorder{}, Topic: "p", Classes: []sluice.Class{sluice.ClassTransient}})
	require.ErrorContains(t, err, "Config.Classes[0]")
}

func TestDiagnosis(t *testing.T) {
	t.Parallel()
	pub := &recorder{}
	mw, err := poison.New(poison.Config{Publisher: pub, Topic: "orders.poison", Queue: "orders"})
	require.NoError(t, err)

	m := message.NewMessage("u", []byte("{bad json"))
	m.Metadata.Set(sluice.EventIDKey, "evt-9")
	m.Metadata.Set(sluice.TraceparentKey, "00-00000000000000000000000000000000-00f067aa0ba902b7-01") // invalid: all zero
	require.NoError(t, run(mw, m, sluice.Poison(errors.New("token=abc "+strings.Repeat("é", 1000)))))
	require.Len(t, pub.got, 1)
	md := pub.got[0].Metadata
	require.Equal(t, "{bad json", string(pub.got[0].Payload))
	require.Equal(t, "poison", md.Get(metakeys.PoisonClass))
	require.Equal(t, "orders", md.Get(metakeys.PoisonQueue))
	require.Equal(t, "1", md.Get(sluice.AttemptKey))
	require.Equal(t, "evt-9", md.Get(sluice.EventIDKey))
	require.LessOrEqual(t, len(md.Get(metakeys.PoisonReason)), 1024, "the reason is cut to 1 KiB")
	require.Contains(t, md.Get(metakeys.PoisonReason), "token=xxxxx")
	require.Empty(t, md.Get(metakeys.PoisonTraceID), "an invalid traceparent gives no trace id")
	require.Equal(t, md.Get(sluice.FirstFailedAtKey), md.Get(metakeys.PoisonedAt), "no earlier failure: first failure is now")

	// Unclassified errors are classified; classes not configured pass through.
	require.NoError(t, run(mw, message.NewMessage("u", nil), &sluice.PanicError{Value: "boom"}))
	require.Equal(t, "invariant", pub.got[1].Metadata.Get(metakeys.PoisonClass))
	herr := context.DeadlineExceeded
	require.Equal(t, herr, run(mw, message.NewMessage("u", nil), herr))
	require.Len(t, pub.got, 2)
}

func TestPublishFailureNacks(t *testing.T) {
	t.Parallel()
	errDown := errors.New("poison queue unroutable")
	mw, err := poison.New(poison.Config{Publisher: &recorder{fail: errDown}, Topic: "p", Env: sluice.Env{PublishBackoff: 30 * time.Millisecond}})
	require.NoError(t, err)
	start := time.Now()
	err = run(mw, message.NewMessage("u", nil), sluice.Poison(errors.New("bad")))
	require.ErrorIs(t, err, errDown, "the original is nacked: nothing is lost")
	require.ErrorContains(t, err, "cannot publish to the poison queue p")
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
}
