package dlq

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/signing"
)

// published records what restore publishes, by topic.
type published map[string][]*message.Message

func (p published) Publish(topic string, msgs ...*message.Message) error {
	p[topic] = append(p[topic], msgs...)
	return nil
}

// archiveOf writes recs, sealed with signer, to a file and returns its path.
func archiveOf(t *testing.T, signer *signing.Signer, recs ...ArchiveRecord) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "archive.jsonl")
	sink, err := OpenFileSink(path)
	require.NoError(t, err)
	for _, rec := range recs {
		rec.seal(signer)
		require.NoError(t, sink.Write(t.Context(), rec))
	}
	require.NoError(t, sink.Close())
	return path
}

func record(id, queue, consumerQueue string) ArchiveRecord {
	return ArchiveRecord{
		ArchivedAt: time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC), ArchivedBy: "alice", Queue: queue,
		UUID: "u-" + id, Class: "poison", Reason: "bad", EventID: id, EventType: "order.created",
		Metadata: map[string]string{metakeys.PoisonQueue: consumerQueue, sluice.EventIDKey: id}, Payload: `{"id":"` + id + `"}`,
	}
}

func restore(t *testing.T, path string, op Config, cfg RestoreConfig) (published, error) {
	t.Helper()
	src, err := OpenFileSource(path)
	require.NoError(t, err)
	defer func() { _ = src.Close() }()
	pub := published{}
	cfg.Source, op.Publisher = src, pub
	_, err = Restore(context.Background(), op, cfg)
	return pub, err
}

// Issue 18 item 8: an edit whose digest was recomputed — what anyone can
// do without the key — still cannot send a record outside its family: its
// queue must be the poison queue of the consumer queue it names. Only --to
// chooses another queue; with a signing key, the edit is refused outright.
func TestRestoreConfinesARecomputedRecordToItsFamily(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, queue, consumer, want string
	}{
		{"a consumer's queue", "payments", "orders", `"payments" is not a poison queue`},
		{"another family's poison queue", "payments.poison", "orders", `"payments.poison" is not the poison queue of "orders"`},
		{"the bare suffix", ".poison", "", `".poison" is not a poison queue`},
		{"no queue", "", "orders", "the record has no queue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := archiveOf(t, nil, record("e1", "orders.poison", "orders"), record("e2", tc.queue, tc.consumer))
			pub, err := restore(t, path, Config{}, RestoreConfig{})
			require.ErrorContains(t, err, "line 2: ")
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "nothing was restored")
			require.Empty(t, pub, "not even line 1")

			pub, err = restore(t, path, Config{}, RestoreConfig{To: "orders.poison"})
			require.NoError(t, err, "--to says where")
			require.Len(t, pub["orders.poison"], 2)
		})
	}
	// The consumer's queue is the family; a record without it (a message
	// the broker dead-lettered) needs only a poison queue.
	path := archiveOf(t, nil, record("e1", "orders.poison", "orders"), record("e2", "billing.poison", ""))
	pub, err := restore(t, path, Config{}, RestoreConfig{})
	require.NoError(t, err)
	require.Len(t, pub["orders.poison"], 1)
	require.Len(t, pub["billing.poison"], 1)
}

// With a signing key a record edited and its digest recomputed is refused
// naming its line; so is an unsigned one. A key of a rotation's past
// verifies what it signed.
func TestRestoreVerifiesTheSignature(t *testing.T) {
	t.Parallel()
	key, old := []byte(strings.Repeat("k", 32)), []byte(strings.Repeat("o", 32))
	signer, err := signing.New(key)
	require.NoError(t, err)
	path := archiveOf(t, signer, record("e1", "orders.poison", "orders"), record("e2", "orders.poison", "orders"))
	_, err = restore(t, path, Config{Signer: signer}, RestoreConfig{})
	require.NoError(t, err)

	rotated, err := signing.New(old, key)
	require.NoError(t, err)
	_, err = restore(t, path, Config{Signer: rotated}, RestoreConfig{})
	require.NoError(t, err, "the previous key verifies")

	// An edit with its digest recomputed, the signature kept.
	src, err := OpenFileSource(path)
	require.NoError(t, err)
	r1, _, err := src.Next(t.Context())
	require.NoError(t, err)
	r2, _, err := src.Next(t.Context())
	require.NoError(t, err)
	require.NoError(t, src.Close())
	sig := r2.Signature
	r2.Payload = `{"id":"e2","amount":1000000}`
	r2.Digest = r2.digest()
	r2.Signature = sig
	tampered := filepath.Join(t.TempDir(), "tampered.jsonl")
	sink, err := OpenFileSink(tampered)
	require.NoError(t, err)
	require.NoError(t, sink.Write(t.Context(), r1))
	require.NoError(t, sink.Write(t.Context(), r2))
	require.NoError(t, sink.Close())

	pub, err := restore(t, tampered, Config{}, RestoreConfig{})
	require.NoError(t, err, "without the key a recomputed digest is all there is to check")
	require.Len(t, pub["orders.poison"], 2)
	pub, err = restore(t, tampered, Config{Signer: signer}, RestoreConfig{})
	require.ErrorIs(t, err, ErrRecordSignature)
	require.ErrorContains(t, err, "tampered.jsonl line 2: the record is not signed with the signing key")
	require.Empty(t, pub)

	other, err := signing.New(old)
	require.NoError(t, err)
	_, err = restore(t, path, Config{Signer: other}, RestoreConfig{})
	require.ErrorIs(t, err, ErrRecordSignature)
	require.ErrorContains(t, err, "line 1: ")
}

// The digest covers every field: each one changed is a mismatch.
func TestDigestCoversEveryField(t *testing.T) {
	t.Parallel()
	base := record("e1", "orders.poison", "orders")
	d := base.digest()
	for name, edit := range map[string]func(*ArchiveRecord){
		"archived_at": func(r *ArchiveRecord) { r.ArchivedAt = r.ArchivedAt.Add(time.Nanosecond) },
		"archived_by": func(r *ArchiveRecord) { r.ArchivedBy = "mallory" },
		"queue":       func(r *ArchiveRecord) { r.Queue = "billing.poison" },
		"uuid":        func(r *ArchiveRecord) { r.UUID = "u-2" },
		"class":       func(r *ArchiveRecord) { r.Class = "exhausted" },
		"reason":      func(r *ArchiveRecord) { r.Reason = "good" },
		"event_id":    func(r *ArchiveRecord) { r.EventID = "e2" },
		"event_type":  func(r *ArchiveRecord) { r.EventType = "order.cancelled" },
		"a header": func(r *ArchiveRecord) {
			r.Metadata = map[string]string{metakeys.PoisonQueue: "orders", sluice.EventIDKey: "e2"}
		},
		"a header added": func(r *ArchiveRecord) {
			r.Metadata = map[string]string{metakeys.PoisonQueue: "orders", sluice.EventIDKey: "e1", "x": ""}
		},
		"key and value moved": func(r *ArchiveRecord) {
			r.Metadata = map[string]string{metakeys.PoisonQueue + "orders": "", sluice.EventIDKey: "e1"}
		},
		"payload":        func(r *ArchiveRecord) { r.Payload = "{}" },
		"payload_base64": func(r *ArchiveRecord) { r.Payload, r.PayloadBase64 = "", base.Payload },
	} {
		r := base
		r.Metadata = map[string]string{metakeys.PoisonQueue: "orders", sluice.EventIDKey: "e1"}
		edit(&r)
		require.NotEqual(t, d, r.digest(), name)
	}
}

// An archive signed before signatures named their queue ("v1:", an HMAC of
// "sluice-sig-v1", nothing, and the record's canonical bytes) still
// restores with its key: the record's queue is among what it covers. One
// v1 signature of another record, or of another key, is refused.
func TestRestoreTakesAnArchiveSignedBeforeQueueBoundSignatures(t *testing.T) {
	t.Parallel()
	key := []byte(strings.Repeat("k", 32))
	signer, err := signing.New(key)
	require.NoError(t, err)
	v1 := func(k []byte, rec ArchiveRecord) string {
		h := hmac.New(sha256.New, k)
		h.Write([]byte("sluice-sig-v1"))
		h.Write([]byte{0})
		c := rec.canonical()
		h.Write(binary.AppendUvarint(nil, uint64(len(c))))
		h.Write(c)
		return "v1:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
	}
	write := func(recs ...ArchiveRecord) string {
		path := filepath.Join(t.TempDir(), "archive.jsonl")
		sink, err := OpenFileSink(path)
		require.NoError(t, err)
		for _, rec := range recs {
			require.NoError(t, sink.Write(t.Context(), rec))
		}
		require.NoError(t, sink.Close())
		return path
	}
	r1, r2 := record("e1", "orders.poison", "orders"), record("e2", "orders.poison", "orders")
	for _, r := range []*ArchiveRecord{&r1, &r2} {
		r.Digest, r.Signature = r.digest(), v1(key, *r)
	}
	pub, err := restore(t, write(r1, r2), Config{Signer: signer}, RestoreConfig{})
	require.NoError(t, err)
	require.Len(t, pub["orders.poison"], 2)

	swapped := r2
	swapped.Signature = r1.Signature
	_, err = restore(t, write(r1, swapped), Config{Signer: signer}, RestoreConfig{})
	require.ErrorIs(t, err, ErrRecordSignature)
	require.ErrorContains(t, err, "line 2: ")
	other := r1
	other.Signature = v1([]byte(strings.Repeat("o", 32)), r1)
	_, err = restore(t, write(other), Config{Signer: signer}, RestoreConfig{})
	require.ErrorIs(t, err, ErrRecordSignature)
}
