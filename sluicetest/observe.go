package sluicetest

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
)

// delivery is what the kit sees of one delivery while the stack runs.
type delivery struct {
	ran       bool
	produced  []string
	diagnosis map[string]string
}

// begin records a delivery of subject starting. Two of one subject may be
// in the stack at once: on RabbitMQ a parked copy came back from a 50 ms
// tier before the delivery that parked it had returned.
func (h *Harness) begin(subject string) *delivery {
	d := &delivery{}
	h.mu.Lock()
	h.current[subject] = append(h.current[subject], d)
	h.active++
	h.mu.Unlock()
	return d
}

// end removes d from those in the stack and appends step to subject's
// trace.
func (h *Harness) end(subject string, d *delivery, step Step) {
	h.mu.Lock()
	h.current[subject] = slices.DeleteFunc(h.current[subject], func(c *delivery) bool { return c == d })
	if len(h.current[subject]) == 0 {
		delete(h.current, subject)
	}
	h.active--
	h.traces[subject] = append(h.traces[subject], step)
	h.mu.Unlock()
	h.signal()
}

// delivering returns the delivery of subject in the stack that began last,
// if any: the one a stage's publish of a copy of it belongs to (an earlier
// one of the subject published its own copies before this one could begin).
func (h *Harness) delivering(subject string) *delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	ds := h.current[subject]
	if len(ds) == 0 {
		return nil
	}
	return ds[len(ds)-1]
}

// observe is the router-level middleware, outside every stage: it gives
// the delivery the Report the stages record its fate in (the Trace stage
// records into it too) and keeps the settled fate as a step of the
// message's trace.
func (h *Harness) observe(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		subject := msg.Metadata.Get(subjectKey)
		attempt, _ := sluice.Attempt(msg)
		d := h.begin(subject)
		orig := msg.Context()
		ctx, rep := sluice.WithReport(context.WithValue(orig, deliveryKey{}, d))
		msg.SetContext(ctx)
		produced, err := next(msg)
		msg.SetContext(orig)
		rep.Settle(err)
		step := Step{Outcome: rep.Outcome, Class: rep.Class, Attempt: max(attempt, 1), Ran: d.ran, Reason: rep.Reason, Diagnosis: d.diagnosis}
		if rep.Outcome == sluice.OutcomeRetried {
			step.TierName = rep.Tier
			step.Tier = h.tierIndex(rep.Tier)
		}
		if rep.Outcome == sluice.OutcomeProcessed || rep.Outcome == sluice.OutcomeRejected {
			step.Produced = d.produced
		}
		if err == nil && h.faults.take(&h.mu, faultCrash) {
			step.Crashed, err = true, errCrashed
		}
		step.At = h.Now()
		h.end(subject, d, step)
		return produced, err
	}
}

// tierIndex returns the 1-based index of the tier named name (or whose
// topic it is), 0 when none.
func (h *Harness) tierIndex(name string) int {
	for i, t := range h.tiers {
		if t.Name == name || slices.Contains(t.Topics(), name) {
			return i + 1
		}
	}
	return 0
}

type deliveryKey struct{}

// deliveryOf returns the delivery msg is in the stack as: observe put it in
// its context.
func (h *Harness) deliveryOf(msg *message.Message) *delivery {
	if d, ok := msg.Context().Value(deliveryKey{}).(*delivery); ok {
		return d
	}
	return h.delivering(msg.Metadata.Get(subjectKey))
}

// ran marks the delivery of msg as having run the handler.
func (h *Harness) ran(msg *message.Message) {
	if d := h.deliveryOf(msg); d != nil {
		h.mu.Lock()
		d.ran = true
		h.mu.Unlock()
	}
}

// produced records the messages a PublishingHandler returned.
func (h *Harness) produced(msg *message.Message, out []*message.Message) {
	d := h.deliveryOf(msg)
	if d == nil {
		return
	}
	ids := make([]string, len(out))
	for i, m := range out {
		ids[i] = cmp.Or(m.Metadata.Get(sluice.EventIDKey), m.UUID)
	}
	h.mu.Lock()
	d.produced = ids
	h.mu.Unlock()
}

// copyPublisher is a stage's publisher of copies, seen by the kit: a fault
// armed for it refuses the publish; a poison copy's diagnosis is kept.
type copyPublisher struct {
	message.Publisher
	h *Harness
	t Target
}

func (p copyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.h.faults.publishFault(&p.h.mu, p.t); err != nil {
		return err
	}
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.t == ToPoison {
		for _, m := range msgs {
			p.h.diagnose(m)
		}
	}
	return nil
}

// diagnose keeps the diagnosis headers of a poison copy on its delivery.
func (h *Harness) diagnose(m *message.Message) {
	diag := map[string]string{}
	for k, v := range m.Metadata {
		if strings.HasPrefix(k, metakeys.PoisonPrefix) {
			diag[k] = v
		}
	}
	if d := h.delivering(m.Metadata.Get(subjectKey)); d != nil {
		h.mu.Lock()
		d.diagnosis = diag
		h.mu.Unlock()
	}
}

// relayPublisher is the outbox relay's publisher: what the handler
// produced, once committed, lands in Relayed.
type relayPublisher struct{ h *Harness }

func (p relayPublisher) Publish(_ string, msgs ...*message.Message) error {
	if err := p.h.faults.publishFault(&p.h.mu, ToRelay); err != nil {
		return err
	}
	p.h.mu.Lock()
	for _, m := range msgs {
		p.h.relayed = append(p.h.relayed, m.Copy())
	}
	p.h.mu.Unlock()
	p.h.signal()
	return nil
}

func (relayPublisher) Close() error { return nil }

// Relayed returns the messages the outbox's relay published so far: what
// the handler produced in committed deliveries, each once.
func (h *Harness) Relayed() []*message.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.relayed)
}

// Trace returns the steps of the message published under subject.
func (h *Harness) Trace(subject string) Trace {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.traces[subject])
}

// Traces returns every subject's trace.
func (h *Harness) Traces() map[string]Trace {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]Trace, len(h.traces))
	for k, v := range h.traces {
		out[k] = slices.Clone(v)
	}
	return out
}

// original returns the message first published under subject (from its
// first delivery's copy kept by the broker is not needed: the kit keeps
// none), rebuilt from the trace's subject.
func (h *Harness) original(subject string) (*message.Message, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.faults.published[subject]
	if !ok {
		return nil, false
	}
	c := m.Copy()
	maps.DeleteFunc(c.Metadata, func(k, _ string) bool { return k == subjectKey })
	return c, true
}
