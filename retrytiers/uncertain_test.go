package retrytiers_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/retrytiers"
)

// byTopic is a publisher that answers each topic with its own error (nil:
// stored) and records every copy it was given, stored or not.
type byTopic struct {
	mu    sync.Mutex
	fail  map[string]error
	tried map[string][]*message.Message
}

func (p *byTopic) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tried == nil {
		p.tried = map[string][]*message.Message{}
	}
	p.tried[topic] = append(p.tried[topic], msgs...)
	return p.fail[topic]
}

func (p *byTopic) Close() error { return nil }

// A tier that refuses the copy for certain (unroutable: its queue is
// missing) is replaced by the next; one whose publish is uncertain (no
// confirm: the copy may be stored there) is not — a copy in another tier
// would be a second retry chain. The delivery is nacked after the backoff.
func TestUncertainPublishTriesNoOtherTier(t *testing.T) {
	t.Parallel()
	ts := tiers(t)
	errMissing := errors.New("returned as unroutable: NO_ROUTE")
	errNoConfirm := fmt.Errorf("%w: no confirm within the confirm timeout", sluice.ErrPublishUncertain)

	t.Run("certain refusal: the next tier", func(t *testing.T) {
		t.Parallel()
		pub := &byTopic{fail: map[string]error{ts[0].Topic: errMissing}}
		mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: ts, PublishBackoff: time.Millisecond})
		require.NoError(t, err)
		_, err = run(mw, message.NewMessage("u", nil), sluice.Transient(errors.New("timeout")))
		require.NoError(t, err, "the copy waits in the next tier; the original is acked")
		require.Len(t, pub.tried[ts[0].Topic], 1)
		require.Len(t, pub.tried[ts[1].Topic], 1)
	})
	t.Run("uncertain: no other tier, nack", func(t *testing.T) {
		t.Parallel()
		pub := &byTopic{fail: map[string]error{ts[0].Topic: errNoConfirm}}
		mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: ts, PublishBackoff: 30 * time.Millisecond})
		require.NoError(t, err)
		start := time.Now()
		_, err = run(mw, message.NewMessage("u", nil), sluice.Transient(errors.New("timeout")))
		require.ErrorIs(t, err, sluice.ErrPublishUncertain)
		require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err), "nacked: the broker delivers it again")
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "after the backoff")
		require.Len(t, pub.tried[ts[0].Topic], 1)
		require.Empty(t, pub.tried[ts[1].Topic], "no copy in a second tier")
		require.Empty(t, pub.tried[ts[2].Topic], "no copy in a second tier")
	})
	t.Run("certain, then uncertain: stops there", func(t *testing.T) {
		t.Parallel()
		pub := &byTopic{fail: map[string]error{ts[0].Topic: errMissing, ts[1].Topic: errNoConfirm}}
		mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: ts, PublishBackoff: time.Millisecond})
		require.NoError(t, err)
		_, err = run(mw, message.NewMessage("u", nil), sluice.Transient(errors.New("timeout")))
		require.ErrorIs(t, err, sluice.ErrPublishUncertain)
		require.ErrorIs(t, err, errMissing)
		require.Len(t, pub.tried[ts[1].Topic], 1)
		require.Empty(t, pub.tried[ts[2].Topic])
	})
}
