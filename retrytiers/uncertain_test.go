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
	"github.com/sluicemq/sluice/signing"
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
		mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: ts, Env: sluice.Env{PublishBackoff: time.Millisecond}})
		require.NoError(t, err)
		_, err = run(mw, message.NewMessage("u", nil), sluice.Transient(errors.New("timeout")))
		require.NoError(t, err, "the copy waits in the next tier; the original is acked")
		require.Len(t, pub.tried[ts[0].Topic], 1)
		require.Len(t, pub.tried[ts[1].Topic], 1)
	})
	t.Run("uncertain: no other tier, nack", func(t *testing.T) {
		t.Parallel()
		pub := &byTopic{fail: map[string]error{ts[0].Topic: errNoConfirm}}
		mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: ts, Env: sluice.Env{PublishBackoff: 30 * time.Millisecond}})
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
		mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: ts, Env: sluice.Env{PublishBackoff: time.Millisecond}})
		require.NoError(t, err)
		_, err = run(mw, message.NewMessage("u", nil), sluice.Transient(errors.New("timeout")))
		require.ErrorIs(t, err, sluice.ErrPublishUncertain)
		require.ErrorIs(t, err, errMissing)
		require.Len(t, pub.tried[ts[1].Topic], 1)
		require.Empty(t, pub.tried[ts[2].Topic])
	})
}

// Two deliveries of one message — the original and its redelivery after
// an uncertain publish — make copies with one identity (message UUID and
// sluice.CopyIDKey), whichever tier takes them, signed as before; the next
// attempt's copy is another.
func TestCopiesOfOneDeliveryShareAnIdentity(t *testing.T) {
	t.Parallel()
	ts := tiers(t)
	signer, err := signing.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	pub := &byTopic{fail: map[string]error{ts[0].Topic: errors.New("returned as unroutable: NO_ROUTE")}}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: ts, Env: sluice.Env{Signer: signer, PublishBackoff: time.Millisecond}})
	require.NoError(t, err)
	delivery := func(uuid string) *message.Message {
		m := message.NewMessage(uuid, []byte("payload"))
		m.Metadata.Set(sluice.EventIDKey, "evt-1")
		return m
	}
	_, err = run(mw, delivery("u1"), sluice.Transient(errors.New("timeout")))
	require.NoError(t, err)
	_, err = run(mw, delivery("u1"), sluice.Transient(errors.New("timeout")))
	require.NoError(t, err)

	refused, stored := pub.tried[ts[0].Topic], pub.tried[ts[1].Topic]
	require.Len(t, stored, 2)
	id := stored[0].UUID
	require.NotEqual(t, "u1", id)
	for _, c := range append(refused, stored...) {
		require.Equal(t, id, c.UUID, "one identity for every copy of the delivery, in any tier")
		require.Equal(t, id, c.Metadata.Get(sluice.CopyIDKey))
	}
	require.NoError(t, signer.Verify(stored[1], ""), "the signature holds (for the queue the handler subscribed to: none here)")

	_, err = run(mw, back(stored[0], ts[1].Topic), sluice.Transient(errors.New("again")))
	require.NoError(t, err)
	next := pub.tried[ts[1].Topic][2]
	require.Equal(t, "3", next.Metadata.Get(sluice.AttemptKey))
	require.NotEqual(t, id, next.UUID, "the next attempt's copy is another")
}
