package signing_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/signing"
)

var (
	keyA = []byte(strings.Repeat("a", 32))
	keyB = []byte(strings.Repeat("b", 32))
)

func copyOf() *message.Message {
	m := message.NewMessage("u", []byte(`{"id":1}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	m.Metadata.Set(sluice.AttemptKey, "2")
	m.Metadata.Set("sluice_poison_queue", "orders")
	m.Metadata.Set("sluice_replay_run", "run-1")
	m.Metadata.Set("custom", "anything")
	return m
}

// A signature covers the payload, the event id and type and every control
// header: changing, adding or removing any of them breaks it; other headers
// do not count. A rotation verifies with the previous key too.
func TestSignerCoversTheControlHeaders(t *testing.T) {
	t.Parallel()
	a, err := signing.New(keyA)
	require.NoError(t, err)
	m := copyOf()
	a.Sign(m, "orders")
	require.True(t, strings.HasPrefix(m.Metadata.Get(sluice.SignatureKey), "v2:"))
	require.NoError(t, a.Verify(m, "orders"))

	m.Metadata.Set("custom", "changed")
	m.Metadata.Set(metakeys.DeadLetterQueue, "orders.retry.30s")
	require.NoError(t, a.Verify(m, "orders"), "not a control header")

	for name, tamper := range map[string]func(*message.Message){
		"attempt":       func(m *message.Message) { m.Metadata.Set(sluice.AttemptKey, "3") },
		"target queue":  func(m *message.Message) { m.Metadata.Set("sluice_poison_queue", "payments") },
		"run removed":   func(m *message.Message) { delete(m.Metadata, "sluice_replay_run") },
		"parked added":  func(m *message.Message) { m.Metadata.Set("sluice_poison_parked", "1") },
		"origin added":  func(m *message.Message) { m.Metadata.Set(metakeys.OriginRoutingKey, "x") },
		"event id":      func(m *message.Message) { m.Metadata.Set(sluice.EventIDKey, "evt-2") },
		"payload":       func(m *message.Message) { m.Payload = []byte(`{"id":2}`) },
		"no signature":  func(m *message.Message) { delete(m.Metadata, sluice.SignatureKey) },
		"not base64":    func(m *message.Message) { m.Metadata.Set(sluice.SignatureKey, "v1:!!") },
		"other version": func(m *message.Message) { m.Metadata.Set(sluice.SignatureKey, "v3:AAAA") },
		"forged v1":     func(m *message.Message) { m.Metadata.Set(sluice.SignatureKey, "v1:AAAA") },
	} {
		c := m.Copy()
		tamper(c)
		err := a.Verify(c, "orders")
		require.ErrorIs(t, err, signing.ErrBadSignature, name)
		require.NotErrorIs(t, err, signing.ErrUnboundSignature, name)
	}

	b, err := signing.New(keyB)
	require.NoError(t, err)
	require.ErrorIs(t, b.Verify(m, "orders"), signing.ErrBadSignature, "another key")
	rotated, err := signing.New(keyB, keyA)
	require.NoError(t, err)
	require.NoError(t, rotated.Verify(m, "orders"), "the previous key still verifies")
	rotated.Sign(m, "orders")
	require.NoError(t, b.Verify(m, "orders"), "and the new one signs")

	_, err = signing.New([]byte("short"))
	require.ErrorContains(t, err, "want at least 32")
	var none *signing.Signer
	none.Sign(m, "orders")
	require.Empty(t, m.Metadata.Get(sluice.SignatureKey), "without a key a copy carries no stale signature")
}

// Issue 28, item 12: a signature is made for the queue the history belongs
// to. A copy signed for "orders" does not verify for "payments" — the same
// key, the same headers — so a correctly signed history forwarded or
// replayed onto another queue is not believed there. Before the fix a
// signature named no queue and verified on every queue of the key.
func TestASignatureForOneQueueDoesNotVerifyForAnother(t *testing.T) {
	t.Parallel()
	a, err := signing.New(keyA)
	require.NoError(t, err)
	m := copyOf()
	a.Sign(m, "orders")
	require.NoError(t, a.Verify(m, "orders"))
	for _, other := range []string{"payments", "", "orders ", "orders.retry.30s", "Orders"} {
		require.ErrorIs(t, a.Verify(m, other), signing.ErrBadSignature, "signed for orders, verified for %q", other)
	}
	owned := func(k string) bool { return k == sluice.AttemptKey }
	require.Nil(t, a.Believe(m.Copy(), owned, "orders"), "believed on its own queue")
	c := m.Copy()
	require.Equal(t, []string{sluice.AttemptKey}, a.Believe(c, owned, "payments", "payments.retry.30s"), "not on another")
	require.Empty(t, c.Metadata.Get(sluice.AttemptKey))

	// The queue is one length-prefixed field: moving bytes between it and
	// the rest does not make another valid signature.
	x := message.NewMessage("u", []byte("ab"))
	x.Metadata.Set(sluice.AttemptKey, "2")
	a.Sign(x, "q")
	y := message.NewMessage("u", []byte("ab"))
	y.Metadata.Set(sluice.AttemptKey, "2")
	y.Metadata.Set(sluice.SignatureKey, x.Metadata.Get(sluice.SignatureKey))
	require.ErrorIs(t, a.Verify(y, "q\x00"), signing.ErrBadSignature)
}

// A v1 signature (written before signatures named their queue) verifies as
// ErrUnboundSignature: it proves Sluice wrote the headers, not for which
// queue. Believe accepts it only on a copy back from one of the queue's own
// tiers (x-death, expired) — a copy that waited in a tier when the
// deployment upgraded — never on a delivery that did not come that way (a
// copy forwarded from another service's queue).
func TestAV1SignatureIsBelievedOnlyBackFromTheQueuesOwnTier(t *testing.T) {
	t.Parallel()
	a, err := signing.New(keyA)
	require.NoError(t, err)
	m := copyOf()
	testenv.SignV1(keyA, m)
	require.ErrorIs(t, a.Verify(m, "orders"), signing.ErrUnboundSignature)
	require.ErrorIs(t, a.Verify(m, "orders"), signing.ErrBadSignature, "an unbound signature is no signature for the queue")
	tampered := m.Copy()
	tampered.Metadata.Set(sluice.AttemptKey, "3")
	require.NotErrorIs(t, a.Verify(tampered, "orders"), signing.ErrUnboundSignature, "a v1 signature that does not match is bad")

	owned := func(k string) bool { return k == sluice.AttemptKey }
	back := func(from, reason string) *message.Message {
		c := m.Copy()
		c.Metadata.Set(metakeys.DeadLetterQueue, from)
		c.Metadata.Set(metakeys.DeadLetterReason, reason)
		return c
	}
	require.Nil(t, a.Believe(back("orders.retry.30s", metakeys.DeadLetterExpired), owned, "orders", "orders.retry.30s"), "back from its own tier")
	for name, c := range map[string]*message.Message{
		"no x-death":           m.Copy(),
		"another queue's tier": back("payments.retry.30s", metakeys.DeadLetterExpired),
		"not expired":          back("orders.retry.30s", "rejected"),
	} {
		require.Equal(t, []string{sluice.AttemptKey}, a.Believe(c, owned, "orders", "orders.retry.30s"), name)
	}
	b, err := signing.New(keyB)
	require.NoError(t, err)
	require.Equal(t, []string{sluice.AttemptKey}, b.Believe(back("orders.retry.30s", metakeys.DeadLetterExpired), owned, "orders", "orders.retry.30s"),
		"a v1 signature of another key is no proof, x-death or not")
}

// Believe removes the owned control headers a delivery cannot prove: with a
// Signer, only the signature for the queue proves (or a v1 one back from a
// tier); without, a dead-letter from one of the tiers given, expired.
func TestBelieve(t *testing.T) {
	t.Parallel()
	owned := func(k string) bool { return k == sluice.AttemptKey }
	var keyless *signing.Signer

	m := copyOf()
	require.Equal(t, []string{sluice.AttemptKey}, keyless.Believe(m, owned, "orders", "orders.retry.30s"))
	require.Empty(t, m.Metadata.Get(sluice.AttemptKey))
	require.Equal(t, "orders", m.Metadata.Get("sluice_poison_queue"), "not owned: left to its stage")

	m = copyOf()
	m.Metadata.Set(metakeys.DeadLetterQueue, "orders.retry.30s")
	m.Metadata.Set(metakeys.DeadLetterReason, metakeys.DeadLetterExpired)
	require.Nil(t, keyless.Believe(m, owned, "orders", "orders.retry.30s"))
	require.Equal(t, "2", m.Metadata.Get(sluice.AttemptKey))

	a, err := signing.New(keyA)
	require.NoError(t, err)
	require.Equal(t, []string{sluice.AttemptKey}, a.Believe(m, owned, "orders", "orders.retry.30s"), "with a key, x-death proves nothing")
	m = copyOf()
	a.Sign(m, "orders")
	require.Nil(t, a.Believe(m, owned, "orders"))
	require.Nil(t, a.Believe(message.NewMessage("u", nil), owned, "orders"), "nothing to believe")
}
