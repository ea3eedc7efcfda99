package dlq

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/signing"
)

// ErrNoTarget is returned for a selected message that has no queue to
// replay to: no sluice_poison_queue, or one not believed (ReplayConfig.To
// names one for it).
var ErrNoTarget = errors.New("dlq: message has no sluice_poison_queue to replay to")

// ErrTargetRefused is returned for a selected message whose target — the
// queue its sluice_poison_queue names, or To — is not one the replay may
// publish to (ReplayConfig.Targets, or the poison queue's family).
var ErrTargetRefused = errors.New("dlq: the message's target is not a queue this replay may publish to")

// target is Queue.Target on cfg.queue.
func (cfg ReplayConfig) target(m *Message) (string, error) {
	why := ""
	switch {
	case m.HeadersError != "":
		return "", fmt.Errorf("%w: %s: %s", ErrUnreadable, m.name(), diag.Printable(m.HeadersError, 200))
	case cfg.To != "":
		if len(cfg.Targets) > 0 && !slices.Contains(cfg.Targets, cfg.To) {
			return "", fmt.Errorf("%w: %s: the queue to replay to, \"%s\", is not one of %s", ErrTargetRefused, m.name(),
				diag.Printable(cfg.To, 255), cfg.allowed())
		}
		return cfg.To, nil
	case m.Queue == "":
		why = "no sluice_poison_queue"
	case cfg.op.Signer != nil && !diagnosedFor(cfg.op.Signer, m):
		why = "its diagnosis is not signed with the replay's signing key for the queue it names: its sluice_poison_queue is not believed"
	case !cfg.allows(m.Queue):
		return "", fmt.Errorf("%w: %s: its sluice_poison_queue names \"%s\", which is not one of %s (a header anyone who can publish to %s can write): redirect it to another queue, or archive or discard it",
			ErrTargetRefused, m.name(), diag.Printable(m.Queue, 255), cfg.allowed(), diag.Printable(cfg.queue, 255))
	default:
		return m.Queue, nil
	}
	return "", fmt.Errorf("%w: %s: %s", ErrNoTarget, m.name(), why)
}

// allows reports whether a message may be replayed to the queue it names.
func (cfg ReplayConfig) allows(queue string) bool {
	if len(cfg.Targets) > 0 {
		return slices.Contains(cfg.Targets, queue)
	}
	return inFamily(cfg.queue, queue)
}

// allowed names the queues a replay may publish to, for an error.
func (cfg ReplayConfig) allowed() string {
	if len(cfg.Targets) == 0 {
		base, ok := strings.CutSuffix(cfg.queue, poisonqueue.Suffix)
		if !ok {
			return fmt.Sprintf("the queues of %s's family (none by name: it does not end in %s)",
				diag.Printable(cfg.queue, 255), poisonqueue.Suffix)
		}
		b := diag.Printable(base, 255)
		return fmt.Sprintf("the queues of %s's family (%s, or a partition %s.p<N>)", diag.Printable(cfg.queue, 255), b, b)
	}
	names := make([]string, 0, min(len(cfg.Targets), 5))
	for _, t := range cfg.Targets[:min(len(cfg.Targets), 5)] {
		names = append(names, diag.Printable(t, 255))
	}
	more := ""
	if n := len(cfg.Targets) - len(names); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	return "the queues it may publish to (" + strings.Join(names, ", ") + more + ")"
}

// inFamily reports whether queue is a consumer queue of poisonQueue by the
// topology's names (rabbitmq.TopologyConfig's defaults): poisonQueue is
// Q.poison and queue is Q, or one of Q's partition queues (Q.p0, Q.p1, …).
// A poison queue named otherwise has no family by name.
func inFamily(poisonQueue, queue string) bool {
	base, ok := strings.CutSuffix(poisonQueue, poisonqueue.Suffix)
	if !ok || base == "" {
		return false
	}
	if queue == base {
		return true
	}
	n, ok := strings.CutPrefix(queue, base+".p")
	i, err := strconv.Atoi(n)
	return ok && err == nil && i >= 0 && rabbitmq.PartitionQueue(base, i) == queue // as the topology names them: no sign, no leading zero
}

// diagnosedFor reports whether m's diagnosis is signed with s for the
// queue it names (sluice_poison_queue): the poison stage of that queue
// wrote it. A v1 signature (signing.ErrUnboundSignature: a copy poisoned
// before signatures named their queue) is accepted here — it covers the
// queue named, which a copy cannot be moved off.
func diagnosedFor(s *signing.Signer, m *Message) bool {
	err := s.Verify(m.Msg, m.Queue)
	return err == nil || errors.Is(err, signing.ErrUnboundSignature)
}
