package testenv

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
)

// SignV1 signs m with key as Sluice did before signatures named their
// queue: "v1:" and an HMAC-SHA256 of "sluice-sig-v1", the signed headers
// (the control headers but sluice.SignatureKey, the event id and type)
// sorted, a zero byte and the payload, each length-prefixed — what the
// copies waiting in tiers, poison queues and archives carry when a
// deployment upgrades. Written out here, apart from sluice's own code, so
// that a change there cannot change the old form too.
func SignV1(key []byte, m *message.Message) {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("sluice-sig-v1"))
	field := func(s string) {
		h.Write(binary.AppendUvarint(nil, uint64(len(s))))
		h.Write([]byte(s))
	}
	var keys []string
	for k := range m.Metadata {
		if k != sluice.SignatureKey && (sluice.IsControlKey(k) || k == sluice.EventIDKey || k == sluice.EventTypeKey) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		field(k)
		field(m.Metadata[k])
	}
	h.Write([]byte{0})
	field(string(m.Payload))
	m.Metadata.Set(sluice.SignatureKey, "v1:"+base64.RawURLEncoding.EncodeToString(h.Sum(nil)))
}
