package sluicetest

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Advance moves the virtual clock d forward, step by step: at each retry
// tier's delay or brake cool-down that ends on the way, the copies come
// back and the handler runs them, and Advance waits until nothing is left
// to run before it moves on. The default ladder (30s → 5m → 30m) takes
// milliseconds. On a real broker it waits d in real time, then for the
// handler to finish what it was given.
func (h *Harness) Advance(d time.Duration) {
	h.t.Helper()
	if err := h.advance(d); err != nil {
		h.t.Fatalf("sluicetest: Advance(%s): %v", d, err)
	}
}

func (h *Harness) advance(d time.Duration) error {
	if h.clock == nil {
		t := time.NewTimer(d)
		defer t.Stop()
		<-t.C
		return h.waitIdle()
	}
	until := h.clock.Now().Add(d)
	for {
		if err := h.waitIdle(); err != nil {
			return err
		}
		if !h.clock.fireDue(until) {
			break
		}
	}
	h.clock.set(until)
	return h.waitIdle()
}

// Settle runs until every published message has an outcome that ends its
// story (processed, duplicate, rejected or poisoned) and nothing waits in
// a tier: on the kit it advances the virtual clock to each delay in turn,
// at most Config.SettleLimit; on a real broker it waits, at most
// Config.IdleTimeout. It fails the test, naming each unfinished message
// and its trace, when that does not happen.
func (h *Harness) Settle() {
	h.t.Helper()
	if err := h.settle(); err != nil {
		h.t.Fatalf("sluicetest: Settle: %v", err)
	}
}

func (h *Harness) settle() error {
	if h.clock == nil {
		deadline := time.Now().Add(h.cfg.IdleTimeout)
		for {
			h.mu.Lock()
			changed := h.changed
			h.mu.Unlock()
			if err := h.waitIdle(); err != nil {
				return err
			}
			if len(h.unsettled()) == 0 {
				return nil
			}
			select {
			case <-changed:
			case <-time.After(time.Until(deadline)):
				return fmt.Errorf("not settled after %s: %s", h.cfg.IdleTimeout, h.describe(h.unsettled()))
			}
		}
	}
	limit := h.clock.Now().Add(h.cfg.SettleLimit)
	for {
		if err := h.waitIdle(); err != nil {
			return err
		}
		if len(h.unsettled()) == 0 && h.emb.PendingRetries() == 0 {
			return nil
		}
		if !h.clock.fireDue(limit) {
			return fmt.Errorf("not settled after %s of virtual time: %s", h.cfg.SettleLimit, h.describe(h.unsettled()))
		}
	}
}

// unsettled returns the subjects whose trace has not ended.
func (h *Harness) unsettled() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, s := range h.subjects {
		if !h.traces[s].Last().final() {
			out = append(out, s)
		}
	}
	return out
}

func (h *Harness) describe(subjects []string) string {
	parts := make([]string, len(subjects))
	for i, s := range subjects {
		parts[i] = fmt.Sprintf("%q: %s", s, h.Trace(s))
	}
	return strings.Join(parts, "; ")
}

// Wait waits, in real time, until the handler finished what it was given
// (the kit moves no virtual time), for a test that publishes and then
// looks, without advancing.
func (h *Harness) Wait() {
	h.t.Helper()
	if err := h.waitIdle(); err != nil {
		h.t.Fatalf("sluicetest: Wait: %v", err)
	}
}

// waitIdle waits until nothing runs: no delivery in a handler or handed
// out, nothing queued that the handler may take (while the brake is
// engaged the queue waits for its probe), no produced row left for the
// relay. Bounded by Config.IdleTimeout.
func (h *Harness) waitIdle() error {
	deadline := time.Now().Add(h.cfg.IdleTimeout)
	quiet := 0
	for {
		busy := h.busy()
		if busy == "" {
			if quiet++; quiet >= 2 {
				return nil
			}
		} else {
			quiet = 0
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the handler did not finish its work within %s (Config.IdleTimeout): %s", h.cfg.IdleTimeout, busy)
		}
		time.Sleep(time.Millisecond) // polling the broker's and the outbox's counts
	}
}

// busy says what still runs, or "".
func (h *Harness) busy() string {
	h.mu.Lock()
	active, closed := h.active, h.closed
	h.mu.Unlock()
	if closed {
		return ""
	}
	if active > 0 {
		return fmt.Sprintf("%d deliveries in the stages", active)
	}
	if h.emb != nil {
		queued, inFlight := h.emb.PubSub().Depth(h.topic)
		if inFlight > 0 {
			return fmt.Sprintf("%d deliveries handed out", inFlight)
		}
		if queued > 0 && !h.brakeEngaged() {
			return fmt.Sprintf("%d deliveries queued", queued)
		}
	}
	if h.cfg.Handler.PublishingHandler != nil {
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.IdleTimeout)
		defer cancel()
		st, err := h.svc.Stores().Outbox.Stats(ctx)
		if err != nil {
			return fmt.Sprintf("the outbox's count: %v", err)
		}
		if st.Pending > 0 {
			return fmt.Sprintf("%d produced messages in the outbox", st.Pending)
		}
	}
	return ""
}
