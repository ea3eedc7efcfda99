package poison

import (
	"cmp"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
)

// oversize is a publisher's error for a copy too large for the broker to
// carry in one piece, by Excess bytes of metadata: rabbitmq.FrameSizeError
// (the AMQP content header over the negotiated frame_max), inside a
// sluice.ErrUnpublishable.
type oversize interface {
	error
	Excess() int
}

// Bounds of a copy cut down to fit (fit).
const (
	// fitSlack is cut beyond the excess the publisher reports: the "…"
	// marking a cut value, a signature's changes.
	fitSlack = 64
	// textFloor is the least a cut reason, stack or last error keeps.
	textFloor = 128
	// keptFloor is the least any other value cut to fit keeps.
	keptFloor = 64
)

// texts are Sluice's own free-text keys on a copy: the first to be cut.
var texts = []string{metakeys.PoisonReason, metakeys.PoisonStack, sluice.LastErrorKey}

// core are the keys a copy cut down to its bare diagnosis keeps.
var core = []string{metakeys.PoisonClass, metakeys.PoisonReason, metakeys.PoisonConsumer, metakeys.PoisonQueue, metakeys.PoisonedAt, metakeys.PoisonDropped, sluice.EventIDKey}

// fit cuts c's metadata by at least excess bytes, so that a publisher that
// refused the copy as too large (oversize) can carry it:
//  1. Sluice's own texts (sluice_poison_reason, sluice_poison_stack,
//     sluice.LastErrorKey), the largest first, each down to textFloor bytes
//     ending in "…" — when that alone is enough: the producer's headers stay
//     whole;
//  2. else the keys a copy cut down to its diagnosis leaves out (kept), the
//     largest first, named in sluice_poison_dropped — the diagnosis stays
//     whole;
//  3. then Sluice's texts as in 1; then every value but the class down to
//     keptFloor bytes, the largest first; then the bare diagnosis: the core
//     keys only, each at most keptFloor bytes, sluice_poison_dropped "*".
//
// A name and its value count for their bytes, which is what any encoding
// carries at least. ok is false when nothing is left to cut.
func (s *stage) fit(c *message.Message, excess int) bool {
	md := c.Metadata
	need := excess + fitSlack
	if need <= 0 {
		return true
	}
	if cuttable(md, texts, textFloor) >= need {
		return cut(md, texts, textFloor, need) <= 0
	}
	var others []string
	for k := range md {
		if !kept(k) && k != sluice.SignatureKey {
			others = append(others, k)
		}
	}
	if len(others) > 0 {
		// sluice_poison_dropped grows by what it names, bounded by
		// errorMaxLength.
		need += len(metakeys.PoisonDropped) + errorMaxLength
		dropped := md[metakeys.PoisonDropped]
		for _, k := range largestFirst(md, others) {
			if need <= 0 {
				break
			}
			need -= len(k) + len(md[k])
			delete(md, k)
			dropped = s.addDropped(dropped, k)
		}
		md[metakeys.PoisonDropped] = dropped
	}
	if need <= 0 {
		return true
	}
	if need = cut(md, texts, textFloor, need); need <= 0 {
		return true
	}
	var rest []string
	for k := range md {
		if k != metakeys.PoisonClass && k != metakeys.PoisonDropped && k != sluice.SignatureKey {
			rest = append(rest, k)
		}
	}
	if need = cut(md, rest, keptFloor, need); need <= 0 {
		return true
	}
	// The bare diagnosis: the core keys, each at most keptFloor bytes.
	bare := false
	for k, v := range md {
		switch {
		case k == metakeys.PoisonClass, k == sluice.SignatureKey:
		case !slices.Contains(core, k), k == metakeys.PoisonDropped:
			delete(md, k)
			bare = true
		case len(v) > keptFloor:
			md[k] = diag.Bound(v, keptFloor)
			bare = true
		}
	}
	md[metakeys.PoisonDropped] = "*"
	return bare
}

// addDropped returns the sluice_poison_dropped list with k added, bounded.
func (s *stage) addDropped(dropped, k string) string {
	k = diag.Printable(k, 64)
	if dropped != "" {
		k = dropped + "," + k
	}
	return diag.Bound(k, errorMaxLength)
}

// cuttable is how many bytes cutting keys down to floor bytes would save.
func cuttable(md message.Metadata, keys []string, floor int) int {
	n := 0
	for _, k := range keys {
		if v, ok := md[k]; ok && len(v) > floor {
			n += len(v) - floor
		}
	}
	return n
}

// cut shortens the values of keys, the largest first, each to no less than
// floor bytes, until need bytes are saved; it returns what is still needed.
func cut(md message.Metadata, keys []string, floor, need int) int {
	for _, k := range largestFirst(md, keys) {
		v := md[k]
		if need <= 0 || len(v) <= floor {
			continue
		}
		nv := diag.Bound(v, max(floor, len(v)-need))
		need -= len(v) - len(nv)
		md[k] = nv
	}
	return need
}

// largestFirst returns the keys of md among keys, the largest (name and
// value) first, ties by name.
func largestFirst(md message.Metadata, keys []string) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if _, ok := md[k]; ok {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(b)+len(md[b]), len(a)+len(md[a])), cmp.Compare(a, b))
	})
	return out
}
