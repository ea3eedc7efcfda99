package sluice_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
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
	a, err := sluice.NewSigner(keyA)
	require.NoError(t, err)
	m := copyOf()
	a.Sign(m)
	require.True(t, strings.HasPrefix(m.Metadata.Get(sluice.SignatureKey), "v1:"))
	require.NoError(t, a.Verify(m))

	m.Metadata.Set("custom", "changed")
	m.Metadata.Set(sluice.DeadLetterQueueKey, "orders.retry.30s")
	require.NoError(t, a.Verify(m), "not a control header")

	for name, tamper := range map[string]func(*message.Message){
		"attempt":       func(m *message.Message) { m.Metadata.Set(sluice.AttemptKey, "3") },
		"target queue":  func(m *message.Message) { m.Metadata.Set("sluice_poison_queue", "payments") },
		"run removed":   func(m *message.Message) { delete(m.Metadata, "sluice_replay_run") },
		"parked added":  func(m *message.Message) { m.Metadata.Set("sluice_poison_parked", "1") },
		"origin added":  func(m *message.Message) { m.Metadata.Set(sluice.OriginRoutingKeyKey, "x") },
		"event id":      func(m *message.Message) { m.Metadata.Set(sluice.EventIDKey, "evt-2") },
		"payload":       func(m *message.Message) { m.Payload = []byte(`{"id":2}`) },
		"no signature":  func(m *message.Message) { delete(m.Metadata, sluice.SignatureKey) },
		"not base64":    func(m *message.Message) { m.Metadata.Set(sluice.SignatureKey, "v1:!!") },
		"other version": func(m *message.Message) { m.Metadata.Set(sluice.SignatureKey, "v2:AAAA") },
	} {
		c := m.Copy()
		tamper(c)
		require.ErrorIs(t, a.Verify(c), sluice.ErrBadSignature, name)
	}

	b, err := sluice.NewSigner(keyB)
	require.NoError(t, err)
	require.ErrorIs(t, b.Verify(m), sluice.ErrBadSignature, "another key")
	rotated, err := sluice.NewSigner(keyB, keyA)
	require.NoError(t, err)
	require.NoError(t, rotated.Verify(m), "the previous key still verifies")
	rotated.Sign(m)
	require.NoError(t, b.Verify(m), "and the new one signs")

	_, err = sluice.NewSigner([]byte("short"))
	require.ErrorContains(t, err, "want at least 32")
	var none *sluice.Signer
	none.Sign(m)
	require.Empty(t, m.Metadata.Get(sluice.SignatureKey), "without a key a copy carries no stale signature")
}

// Believe removes the owned control headers a delivery cannot prove: with a
// Signer, only the signature proves; without, a dead-letter from one of
// the queues given, expired.
func TestBelieve(t *testing.T) {
	t.Parallel()
	owned := func(k string) bool { return k == sluice.AttemptKey }
	var keyless *sluice.Signer

	m := copyOf()
	require.Equal(t, []string{sluice.AttemptKey}, keyless.Believe(m, owned, "orders.retry.30s"))
	require.Empty(t, m.Metadata.Get(sluice.AttemptKey))
	require.Equal(t, "orders", m.Metadata.Get("sluice_poison_queue"), "not owned: left to its stage")

	m = copyOf()
	m.Metadata.Set(sluice.DeadLetterQueueKey, "orders.retry.30s")
	m.Metadata.Set(sluice.DeadLetterReasonKey, sluice.DeadLetterExpired)
	require.Nil(t, keyless.Believe(m, owned, "orders.retry.30s"))
	require.Equal(t, "2", m.Metadata.Get(sluice.AttemptKey))

	a, err := sluice.NewSigner(keyA)
	require.NoError(t, err)
	require.Equal(t, []string{sluice.AttemptKey}, a.Believe(m, owned, "orders.retry.30s"), "with a key, x-death proves nothing")
	m = copyOf()
	a.Sign(m)
	require.Nil(t, a.Believe(m, owned))
	require.Nil(t, a.Believe(message.NewMessage("u", nil), owned), "nothing to believe")
}
