package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
)

// Target is one of the handler's publishers a publish fault is armed for.
type Target int

// The publishers a fault can refuse.
const (
	// ToTier is the retry stage's publisher of copies into the tiers (and
	// the poison stage's, parking a copy the poison queue refused).
	ToTier Target = iota
	// ToPoison is the poison stage's publisher into the poison queue.
	ToPoison
	// ToRelay is the outbox relay's publisher of what the handler produced.
	ToRelay
)

func (t Target) String() string {
	switch t {
	case ToTier:
		return "the retry tiers"
	case ToPoison:
		return "the poison queue"
	case ToRelay:
		return "the outbox relay"
	}
	return fmt.Sprintf("Target(%d)", int(t))
}

// The errors of the faults the kit injects.
var (
	// ErrNacked is a publish the broker refused (a negative confirm).
	ErrNacked = errors.New("sluicetest: injected fault: the broker nacked the publish")
	// ErrUnroutable is a publish the broker returned: no queue is bound.
	ErrUnroutable = errors.New("sluicetest: injected fault: the publish is unroutable (returned by the broker)")
	// errCommitFailed is a commit of the inbox's transaction that failed:
	// the connection was lost at COMMIT (Transient by default).
	errCommitFailed = fmt.Errorf("sluicetest: injected fault: the commit failed: %w", syscall.ECONNRESET)
	// errCrashed is what the kit returns for a delivery whose ack it
	// drops: the router nacks it and the broker delivers it again.
	errCrashed = errors.New("sluicetest: injected fault: the process crashed between the commit and the ack")
)

type fault int

const (
	faultCrash fault = iota
	faultCommit
)

// faults are the faults armed, under Harness.mu.
type faults struct {
	publish    map[Target][]error // the errors of the next publishes, in order
	counts     map[fault]int
	unreach    time.Duration // the dependency is unreachable until this virtual time
	published  map[string]*message.Message
	unfinished []*message.Message
}

// take disarms one fault of kind f and reports whether one was armed.
func (f *faults) take(mu *sync.Mutex, kind fault) bool {
	mu.Lock()
	defer mu.Unlock()
	if f.counts[kind] == 0 {
		return false
	}
	f.counts[kind]--
	return true
}

// publishFault returns the error of the next publish to t, if one is armed.
func (f *faults) publishFault(mu *sync.Mutex, t Target) error {
	mu.Lock()
	defer mu.Unlock()
	errs := f.publish[t]
	if len(errs) == 0 {
		return nil
	}
	f.publish[t] = errs[1:]
	return fmt.Errorf("publishing to %s: %w", t, errs[0])
}

func (h *Harness) arm(kind fault, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.faults.counts == nil {
		h.faults.counts = map[fault]int{}
	}
	h.faults.counts[kind] += n
}

// FailPublishes makes the next n publishes to t fail with err (ErrNacked,
// ErrUnroutable, or an error of your own): the stage that publishes sees
// the broker refuse its copy.
func (h *Harness) FailPublishes(t Target, n int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.faults.publish == nil {
		h.faults.publish = map[Target][]error{}
	}
	for range n {
		h.faults.publish[t] = append(h.faults.publish[t], err)
	}
}

// FailCommits makes the next n commits of the inbox's transaction fail
// (a lost connection, ECONNRESET) after the handler succeeded: the delivery's writes roll
// back and it is retried as Transient. It needs the kit's SQLite database
// (Config.DB unset).
func (h *Harness) FailCommits(n int) {
	h.t.Helper()
	if h.cfg.DB != nil {
		h.t.Fatalf("sluicetest: FailCommits needs the kit's SQLite database: Config.DB is your own")
	}
	h.arm(faultCommit, n)
}

// CrashAfterCommit drops the ack of the next n deliveries that committed,
// as a process that crashed between its commit and its ack: the broker
// delivers each again, and the inbox recognises the redelivery as a
// duplicate.
func (h *Harness) CrashAfterCommit(n int) { h.arm(faultCrash, n) }

// Unreachable makes Dependency fail for d of virtual time from now: a
// database or service the handler calls is down. The brake (its default
// matches unreachable dependencies) engages when enough deliveries fail so.
func (h *Harness) Unreachable(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults.unreach = h.nowLocked() + d
}

func (h *Harness) nowLocked() time.Duration {
	if h.clock == nil {
		return time.Since(h.start)
	}
	return h.clock.Now().Sub(epoch)
}

// Dependency stands for a dependency the handler calls: it returns nil, or,
// while Unreachable holds, a refused connection (Transient, and what
// brake.MatchUnreachable counts). Call it from the handler under test.
func (h *Harness) Dependency(context.Context) error {
	h.mu.Lock()
	down := h.nowLocked() < h.faults.unreach
	h.mu.Unlock()
	if !down {
		return nil
	}
	return &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("sluicetest: injected fault: the dependency is unreachable: %w", syscall.ECONNREFUSED)}
}

var _ = sluice.ClassTransient
