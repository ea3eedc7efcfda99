package dlq

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/signing"
)

// digestPrefix starts a record's digest: the algorithm, then hex.
const digestPrefix = "sha256:"

// Errors of a record restore refuses, before anything is published.
var (
	// ErrDigest is matched by a record whose digest is missing or does not
	// match its contents: damaged or edited after archive wrote it.
	ErrDigest = errors.New("the record's digest does not match its contents")
	// ErrRecordSignature is matched by a record not signed with the
	// signing key restore was given (Config.Signer).
	ErrRecordSignature = errors.New("the record is not signed with the signing key")
	// ErrOutsideFamily is matched by a record whose queue is not the
	// poison queue of its own family: restore publishes a record only back
	// to where it was archived from, unless RestoreConfig.To says where.
	ErrOutsideFamily = errors.New("the record's queue is not its family's poison queue")
)

// canonical is the encoding the digest and the signature cover: every
// field of the record but the two, each length-prefixed, the metadata's
// keys sorted, after a label of its own (so that a signature of a record is
// never one of a message: the stages sign messages whose signed fields
// always include control headers, never a bare payload).
func (rec ArchiveRecord) canonical() []byte {
	b := []byte("sluice-archive-record-v1\x00")
	put := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	put(rec.ArchivedAt.UTC().Format(time.RFC3339Nano))
	for _, s := range [...]string{rec.ArchivedBy, rec.Queue, rec.UUID, rec.Class, rec.Reason, rec.EventID, rec.EventType} {
		put(s)
	}
	keys := make([]string, 0, len(rec.Metadata))
	for k := range rec.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	put(strconv.Itoa(len(keys)))
	for _, k := range keys {
		put(k)
		put(rec.Metadata[k])
	}
	put(rec.Payload)
	put(rec.PayloadBase64)
	return b
}

// digest is the record's SHA-256 digest as archive writes it.
func (rec ArchiveRecord) digest() string {
	sum := sha256.Sum256(rec.canonical())
	return digestPrefix + hex.EncodeToString(sum[:])
}

// seal sets the record's digest and, with a signer, its signature.
func (rec *ArchiveRecord) seal(s *signing.Signer) {
	rec.Digest, rec.Signature = rec.digest(), ""
	if s != nil {
		m := message.NewMessage("", rec.canonical())
		s.Sign(m, rec.Queue)
		rec.Signature = m.Metadata.Get(sluice.SignatureKey)
	}
}

// verify checks the record's digest and, with a signer, its signature. A
// record without a digest (written before archives had one) passes only
// with undigested.
func (rec ArchiveRecord) verify(s *signing.Signer, undigested bool) error {
	switch {
	case rec.Digest == "" && !undigested:
		return fmt.Errorf("%w: it has none (an archive written before digests)", ErrDigest)
	case rec.Digest != "" && rec.Digest != rec.digest():
		return ErrDigest
	}
	if s == nil {
		return nil
	}
	if rec.Signature == "" {
		return fmt.Errorf("%w: it has no signature", ErrRecordSignature)
	}
	m := message.NewMessage("", rec.canonical())
	m.Metadata.Set(sluice.SignatureKey, rec.Signature)
	// A v1 signature (an archive written before signatures named their
	// queue) is as good here: the record's queue is among what it covers.
	if err := s.Verify(m, rec.Queue); err != nil && !errors.Is(err, signing.ErrUnboundSignature) {
		return fmt.Errorf("%w: %w", ErrRecordSignature, err)
	}
	return nil
}

// family returns where a record goes without To: the queue it was
// archived from, when that is a poison queue ("Q.poison") and, when the
// record names its consumer's queue (sluice_poison_queue Q), that queue's.
// Anything else — a consumer's queue, another family's poison queue — is
// refused: a record edited to name another queue publishes nothing.
func (rec ArchiveRecord) family() (string, error) {
	q := rec.Queue
	if q == "" {
		return "", fmt.Errorf("%w: the record has no queue to restore it to", ErrOutsideFamily)
	}
	if !strings.HasSuffix(q, poisonqueue.Suffix) || q == poisonqueue.Suffix {
		return "", fmt.Errorf("%w: %q is not a poison queue", ErrOutsideFamily, diag.Bound(q, 255))
	}
	if c := rec.Metadata[metakeys.PoisonQueue]; c != "" && q != c+poisonqueue.Suffix {
		return "", fmt.Errorf("%w: %q is not the poison queue of %q, the consumer's queue it names", ErrOutsideFamily, diag.Bound(q, 255), diag.Bound(c, 255))
	}
	return q, nil
}
