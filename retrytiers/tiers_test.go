package retrytiers_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/signing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a publisher that records what it is given, and fails while
// fail is set: the fault a real broker outage would cause.
type recorder struct {
	mu     sync.Mutex
	got    map[string][]*message.Message
	fail   error
	ctxErr []error             // each published message's context error at Publish
	ctxVal []func(key any) any // each published message's context values
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	if r.got == nil {
		r.got = map[string][]*message.Message{}
	}
	r.got[topic] = append(r.got[topic], msgs...)
	for _, m := range msgs {
		r.ctxErr = append(r.ctxErr, m.Context().Err())
		r.ctxVal = append(r.ctxVal, m.Context().Value)
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func tiers(t *testing.T) []broker.Tier {
	t.Helper()
	ts, err := broker.Ladder("orders", 30*time.Second, 5*time.Minute, 90*time.Minute)
	require.NoError(t, err)
	return ts
}

func TestLadder(t *testing.T) {
	t.Parallel()
	require.Equal(t, []broker.Tier{
		{Name: "30s", Delay: 30 * time.Second, Topic: "orders.retry.30s"},
		{Name: "5m", Delay: 5 * time.Minute, Topic: "orders.retry.5m"},
		{Name: "1h30m", Delay: 90 * time.Minute, Topic: "orders.retry.1h30m"},
	}, tiers(t))
	def, err := broker.Ladder("q")
	require.NoError(t, err)
	require.Len(t, def, 3)
	require.Equal(t, "q.retry.30m", def[2].Topic)
	_, err = broker.Ladder("")
	require.Error(t, err)
	_, err = broker.Ladder("q", time.Second, time.Second)
	require.ErrorContains(t, err, "two tiers")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := retrytiers.New(retrytiers.Config{Tiers: tiers(t)})
	require.ErrorContains(t, err, "Config.Publisher is required")
	_, err = retrytiers.New(retrytiers.Config{Publisher: &recorder{}})
	require.ErrorContains(t, err, "Config.Tiers is required")
	_, err = retrytiers.New(retrytiers.Config{Publisher: &recorder{}, Tiers: []broker.Tier{{Name: "x"}}})
	require.ErrorContains(t, err, "Config.Tiers[0]")
}

func run(mw message.HandlerMiddleware, msg *message.Message, herr error) ([]*message.Message, error) {
	return mw(func(*message.Message) ([]*message.Message, error) { return nil, herr })(msg)
}

func TestRetryCopyAndBudget(t *testing.T) {
	t.Parallel()
	pub := &recorder{}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: tiers(t)})
	require.NoError(t, err)

	orig := message.NewMessage("uuid-1", []byte("payload"))
	orig.Metadata.Set(sluice.EventIDKey, "evt-1")
	_, err = run(mw, orig, errors.New("dial tcp: connection refused by postgres://u:secret@db/x, and more text"+strings.Repeat(" and more", 200)))
	require.NoError(t, err, "the original is acked once its copy is published")
	c := back(pub.got["orders.retry.30s"][0], "orders.retry.30s")
	require.NotEqual(t, orig.UUID, c.UUID)
	require.Equal(t, "payload", string(c.Payload))
	require.Equal(t, "evt-1", c.Metadata.Get(sluice.EventIDKey))
	require.Equal(t, "2", c.Metadata.Get(sluice.AttemptKey))
	require.Equal(t, "30s", c.Metadata.Get(sluice.RetryTierKey))
	require.LessOrEqual(t, len(c.Metadata.Get(sluice.LastErrorKey)), 1024, "the last error is cut to 1 KiB")
	require.NotContains(t, c.Metadata.Get(sluice.LastErrorKey), "secret")
	first := c.Metadata.Get(sluice.FirstFailedAtKey)
	require.NotEmpty(t, first)
	require.Empty(t, orig.Metadata.Get(sluice.AttemptKey), "the original is not modified")

	// Attempt 3 goes to the third tier and keeps the first failure time.
	_, err = run(mw, c, sluice.Transient(errors.New("again")))
	require.NoError(t, err)
	c3 := back(pub.got["orders.retry.5m"][0], "orders.retry.5m")
	require.Equal(t, "3", c3.Metadata.Get(sluice.AttemptKey))
	_, err = run(mw, c3, context.DeadlineExceeded)
	require.NoError(t, err)
	c4 := back(pub.got["orders.retry.1h30m"][0], "orders.retry.1h30m")
	require.Equal(t, "4", c4.Metadata.Get(sluice.AttemptKey))
	require.Equal(t, first, c4.Metadata.Get(sluice.FirstFailedAtKey))

	// Attempt 4 has no tier left.
	_, err = run(mw, c4, context.DeadlineExceeded)
	require.Equal(t, sluice.ClassExhausted, sluice.ClassOf(err))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "retry budget spent after 4 attempts")
}

// back is c as it comes back from the tier topic: dead-lettered from it,
// expired (what x-death says on RabbitMQ).
func back(c *message.Message, topic string) *message.Message {
	c = c.Copy()
	c.Metadata.Set(metakeys.DeadLetterQueue, topic)
	c.Metadata.Set(metakeys.DeadLetterReason, metakeys.DeadLetterExpired)
	return c
}

// A retry history the delivery cannot prove Sluice wrote is removed: a
// producer's sluice_attempt of 999999999999 is a first attempt, which goes
// to the first tier; so is one that claims a tier of another queue, and,
// with a Signer, one whose copy is unsigned or whose signature is forged —
// even dead-lettered from the tier.
func TestForgedRetryHistoryIsNotBelieved(t *testing.T) {
	t.Parallel()
	signer, err := signing.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	forged := func(md ...string) *message.Message {
		m := message.NewMessage("u", []byte("payload"))
		m.Metadata.Set(sluice.EventIDKey, "evt-1")
		m.Metadata.Set(sluice.AttemptKey, "999999999999")
		m.Metadata.Set(sluice.FirstFailedAtKey, "1999-01-01T00:00:00Z")
		m.Metadata.Set(metakeys.OriginRoutingKey, "elsewhere")
		for i := 0; i+1 < len(md); i += 2 {
			m.Metadata.Set(md[i], md[i+1])
		}
		return m
	}
	for name, tc := range map[string]struct {
		signer *signing.Signer
		msg    *message.Message
	}{
		"keyless, no x-death":           {nil, forged()},
		"keyless, another queue's tier": {nil, back(forged(), "payments.retry.30s")},
		"keyless, not expired":          {nil, forged(metakeys.DeadLetterQueue, "orders.retry.30s", metakeys.DeadLetterReason, "rejected")},
		"signed, unsigned copy":         {signer, back(forged(), "orders.retry.30s")},
		"signed, forged signature":      {signer, back(forged(sluice.SignatureKey, "v2:AAAA"), "orders.retry.30s")},
		"signed, forged v1 signature":   {signer, back(forged(sluice.SignatureKey, "v1:AAAA"), "orders.retry.30s")},
		"signed for another queue":      {signer, back(signedFor(signer, forged(), "payments"), "orders.retry.30s")},
	} {
		pub := &recorder{}
		mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: tiers(t), Env: sluice.Env{Signer: tc.signer}, Queue: "orders"})
		require.NoError(t, err)
		_, err = run(mw, tc.msg, sluice.Transient(errors.New("timeout")))
		require.NoError(t, err, name)
		require.Len(t, pub.got["orders.retry.30s"], 1, "%s: the first tier, not exhausted", name)
		c := pub.got["orders.retry.30s"][0]
		require.Equal(t, "2", c.Metadata.Get(sluice.AttemptKey), name)
		require.NotEqual(t, "1999-01-01T00:00:00Z", c.Metadata.Get(sluice.FirstFailedAtKey), name)
		require.Empty(t, c.Metadata.Get(metakeys.OriginRoutingKey), name)
		if tc.signer != nil {
			require.NoError(t, tc.signer.Verify(c, "orders"), "%s: the copy is signed for its queue", name)
			require.ErrorIs(t, tc.signer.Verify(c, "payments"), signing.ErrBadSignature, "%s: and no other", name)
		}
	}

	// A copy signed for the queue is believed, wherever it comes from: the
	// signature is the proof.
	pub := &recorder{}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: tiers(t), Env: sluice.Env{Signer: signer}, Queue: "orders"})
	require.NoError(t, err)
	m := message.NewMessage("u", []byte("payload"))
	m.Metadata.Set(sluice.AttemptKey, "3")
	signer.Sign(m, "orders")
	_, err = run(mw, m, sluice.Transient(errors.New("timeout")))
	require.NoError(t, err)
	require.Equal(t, "4", pub.got["orders.retry.1h30m"][0].Metadata.Get(sluice.AttemptKey))
	m.Payload = []byte("another payload")
	_, err = run(mw, m, sluice.Transient(errors.New("timeout")))
	require.NoError(t, err)
	require.Equal(t, "2", pub.got["orders.retry.30s"][0].Metadata.Get(sluice.AttemptKey), "the signature covers the payload")
}

func TestOtherClassesPassThrough(t *testing.T) {
	t.Parallel()
	pub := &recorder{}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: tiers(t)})
	require.NoError(t, err)
	for _, herr := range []error{nil, sluice.Poison(errors.New("bad")), sluice.Invariant(errors.New("gone")), sluice.Reject(errors.New("no"))} {
		_, err := run(mw, message.NewMessage("u", nil), herr)
		require.Equal(t, herr, err)
	}
	require.Empty(t, pub.got)
}

func TestPublishFailureNacksAfterBackoff(t *testing.T) {
	t.Parallel()
	errDown := errors.New("tier queue unreachable")
	pub := &recorder{fail: errDown}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: tiers(t), Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}})
	require.NoError(t, err)

	start := time.Now()
	_, err = run(mw, message.NewMessage("u", nil), sluice.Transient(errors.New("timeout")))
	require.ErrorIs(t, err, errDown)
	require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err), "the original is nacked, not poisoned")
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "the backoff is waited before the nack")

	// The backoff does not end with the message context: a handler that
	// timed out (Watermill's Timeout) must not turn a failed publish into a
	// hot redelivery loop.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	m := message.NewMessage("u", nil)
	m.SetContext(ctx)
	start = time.Now()
	_, err = run(mw, m, sluice.Transient(context.DeadlineExceeded))
	require.ErrorIs(t, err, errDown)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "the backoff is waited although the message context expired")
}

// A copy is published on a context detached from the handler's deadline:
// the publisher sees a live context, with the message context's values.
func TestCopyPublishedAfterTheHandlerDeadline(t *testing.T) {
	t.Parallel()
	pub := &recorder{}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: tiers(t)})
	require.NoError(t, err)
	type key struct{}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), key{}, "kept"), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	m := message.NewMessage("u", nil)
	m.SetContext(ctx)
	_, err = run(mw, m, context.DeadlineExceeded)
	require.NoError(t, err, "a timed-out handler goes to its tier")
	require.Len(t, pub.got["orders.retry.30s"], 1)
	require.NoError(t, pub.ctxErr[0], "the copy's context is live when published")
	require.Equal(t, "kept", pub.ctxVal[0](key{}))
}

func TestDelayedPublisher(t *testing.T) {
	t.Parallel()
	target := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
	defer func() { _ = target.Close() }()
	out, err := target.Subscribe(context.Background(), "orders")
	require.NoError(t, err)

	ts, err := broker.Ladder("orders", 50*time.Millisecond, time.Hour)
	require.NoError(t, err)
	p, err := embedded.NewDelayedPublisher(embedded.DelayedPublisherConfig{Target: target, Routes: embedded.Routes("orders", ts)})
	require.NoError(t, err)

	start := time.Now()
	require.NoError(t, p.Publish(ts[0].Topic, message.NewMessage("u1", []byte("a"))))
	require.NoError(t, p.Publish(ts[1].Topic, message.NewMessage("u2", []byte("b"))))
	require.ErrorContains(t, p.Publish("nowhere", message.NewMessage("u3", nil)), `no delayed route from topic "nowhere"`)
	select {
	case m := <-out:
		require.Equal(t, "u1", m.UUID)
		require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
		m.Ack()
	case <-time.After(time.Minute):
		t.Fatal("the delayed message did not arrive")
	}
	require.Equal(t, 1, p.Pending())
	require.ErrorContains(t, p.Close(), "1 still waiting at Close", "Close says what it drops: not durable")
	require.NoError(t, p.Close())
	require.ErrorContains(t, p.Publish(ts[0].Topic, message.NewMessage("u4", nil)), "embedded: delayed publisher closed")
}

// signedFor signs m with s for queue and returns it.
func signedFor(s *signing.Signer, m *message.Message, queue string) *message.Message {
	s.Sign(m, queue)
	return m
}
