// Package signing holds the HMAC-SHA256 Signer of Sluice's control headers:
// the key the retry-tier, poison and replay stages and `sluice dlq replay`
// share, so that a stage believes the attempt, the poison diagnosis and the
// replay run of a delivery only when Sluice wrote them, for that queue (see
// sluice.IsControlKey and docs/architecture.md, "Trust boundary").
package signing

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
)

// keyMinLength is the shortest key New takes, in bytes.
const keyMinLength = 32

// Signer signs the control headers of the copies Sluice publishes and
// verifies them on the way in. Give the same Signer (the same key) to the
// retry-tier, poison and replay stages of every consumer of a queue family,
// and the key to `sluice dlq replay` (--signing-key-file). It is safe for
// concurrent use.
type Signer struct {
	keys [][]byte
}

// New returns a Signer that signs with key and verifies with key and
// each of previous (for a rotation: sign with the new key, keep the old one
// for the copies still waiting in tiers). Each key must be at least
// 32 bytes (random bytes; e.g. `openssl rand 32`).
func New(key []byte, previous ...[]byte) (*Signer, error) {
	keys := append([][]byte{key}, previous...)
	for i, k := range keys {
		if len(k) < keyMinLength {
			return nil, fmt.Errorf("sluice: signing key %d is %d bytes: want at least %d", i, len(k), keyMinLength)
		}
		keys[i] = slices.Clone(k)
	}
	return &Signer{keys: keys}, nil
}

// NewFromFile returns the Signer of the key in the file at path: its
// contents with surrounding whitespace trimmed (e.g. written by
// `openssl rand -hex 32 > sluice.key`). The stages' services and
// `sluice dlq replay --signing-key-file` read the same file this way.
func NewFromFile(path string) (*Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sluice: reading the signing key: %w", err)
	}
	return New(bytes.TrimSpace(b))
}

// ErrBadSignature is matched by Verify's error for a delivery whose control
// headers are not signed by one of the Signer's keys for the queue given.
var ErrBadSignature = errors.New("sluice: control headers not signed by Sluice")

// ErrUnboundSignature is matched (with ErrBadSignature) by Verify's error
// for a "v1:" signature that verifies: one written before signatures named
// their queue (Sluice before issue 28), which proves Sluice wrote the
// headers but not for which queue. Believe accepts it only on a copy back
// from one of the queue's own tiers, as x-death shows it; `sluice dlq`
// accepts it on a poison copy's own diagnosis.
var ErrUnboundSignature = fmt.Errorf("%w: a v1 signature, which names no queue", ErrBadSignature)

// Sign sets msg's sluice.SignatureKey for queue — the consumer's queue whose
// stages the control headers belong to: the one a tier or park copy comes
// back to, a poison copy names (sluice_poison_queue) and a replay is sent
// to — over its payload, event id and type and control headers, as they
// are now: call it last, once the copy is built. A nil Signer removes
// sluice.SignatureKey instead (a copy never carries a stale signature).
func (s *Signer) Sign(msg *message.Message, queue string) {
	delete(msg.Metadata, sluice.SignatureKey)
	if s == nil {
		return
	}
	msg.Metadata[sluice.SignatureKey] = "v2:" + base64.RawURLEncoding.EncodeToString(mac(s.keys[0], sigV2, queue, msg))
}

// Verify returns nil when msg's sluice.SignatureKey is a signature of one of the
// Signer's keys over msg as it is, for queue, else an error matching
// ErrBadSignature: a signature made for another queue does not verify, so
// a copy forwarded or replayed onto another queue does not carry its
// history there. A v1 signature that verifies returns an error matching
// ErrUnboundSignature.
func (s *Signer) Verify(msg *message.Message, queue string) error {
	v := msg.Metadata.Get(sluice.SignatureKey)
	if v == "" {
		return fmt.Errorf("%w: no %s", ErrBadSignature, sluice.SignatureKey)
	}
	version, enc, _ := strings.Cut(v, ":")
	sum, err := base64.RawURLEncoding.DecodeString(enc)
	if (version != sigV1 && version != sigV2) || err != nil {
		return fmt.Errorf("%w: %s is not a v2 (or v1) signature", ErrBadSignature, sluice.SignatureKey)
	}
	for _, k := range s.keys {
		if hmac.Equal(sum, mac(k, version, queue, msg)) {
			if version == sigV1 {
				return ErrUnboundSignature
			}
			return nil
		}
	}
	if version == sigV1 {
		return fmt.Errorf("%w: the v1 signature does not match", ErrBadSignature)
	}
	return fmt.Errorf("%w: the signature does not match (made for another queue, with another key, or the headers changed)", ErrBadSignature)
}

// Signature versions: v1 names no queue, v2 the queue given to Sign.
const (
	sigV1 = "v1"
	sigV2 = "v2"
)

// mac is the HMAC-SHA256 under key of msg's signed fields, each length-
// prefixed, the keys sorted: (v2) the queue, the control headers but
// sluice.SignatureKey, the event id and type, and the payload.
func mac(key []byte, version, queue string, msg *message.Message) []byte {
	h := hmac.New(sha256.New, key)
	if version == sigV1 {
		h.Write([]byte("sluice-sig-v1"))
	} else {
		h.Write([]byte("sluice-sig-v2"))
		field(h, queue)
	}
	keys := make([]string, 0, 8)
	for k := range msg.Metadata {
		if k != sluice.SignatureKey && (sluice.IsControlKey(k) || k == sluice.EventIDKey || k == sluice.EventTypeKey) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		field(h, k)
		field(h, msg.Metadata[k])
	}
	h.Write([]byte{0})
	field(h, string(msg.Payload))
	return h.Sum(nil)
}

func field(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}

// written reports whether msg's control headers are Sluice's, written for
// queue: with a Signer, its signature verifies for queue — or it is a v1
// signature (ErrUnboundSignature) on a copy back from one of tiers; without
// one (s nil), it was dead-lettered (expired) from one of tiers — the
// consumer's own tier queues.
func (s *Signer) written(msg *message.Message, queue string, tiers ...string) bool {
	if s != nil {
		err := s.Verify(msg, queue)
		return err == nil || errors.Is(err, ErrUnboundSignature) && backFrom(msg, tiers)
	}
	return backFrom(msg, tiers)
}

// backFrom reports whether msg was dead-lettered (expired) from one of
// tiers, as x-death shows it.
func backFrom(msg *message.Message, tiers []string) bool {
	from := msg.Metadata.Get(metakeys.DeadLetterQueue)
	return from != "" && msg.Metadata.Get(metakeys.DeadLetterReason) == metakeys.DeadLetterExpired && slices.Contains(tiers, from)
}

// Believe removes from msg the control headers owned says the caller acts
// on, unless written(msg, queue, tiers...) holds, and returns the keys
// removed (none when msg carries none of them; the signature is only
// checked then). queue is the consumer's queue the caller's stages serve
// (the one a copy of theirs is signed for), tiers the queues a copy of
// theirs comes back from (the retry tiers, the park topic). Each stage
// calls it on the way in for its own keys, so that a signature stays
// checkable by the stages inside it: one that does not verify keeps every
// stage's keys out.
func (s *Signer) Believe(msg *message.Message, owned func(string) bool, queue string, tiers ...string) []string {
	var keys []string
	for k := range msg.Metadata {
		if owned(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 || s.written(msg, queue, tiers...) {
		return nil
	}
	for _, k := range keys {
		delete(msg.Metadata, k)
	}
	slices.Sort(keys)
	return keys
}
