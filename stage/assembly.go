package stage

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/stack"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// unisolatedLogInterval is the least time between two log lines of one
// handler about a failure nothing isolates (see Classify).
const unisolatedLogInterval = time.Minute

// watermillAMQPSubscriber is the name Watermill's router gives a handler
// whose subscriber is watermill-amqp's (message.SubscriberNameFromCtx).
const watermillAMQPSubscriber = "amqp.Subscriber"

// assembly is what Classify can tell of the stack around it from the
// deliveries it sees, by handler: it says once what the stack lacks, and
// explains, at most once per unisolatedLogInterval, the failures nothing
// isolates.
type assembly struct {
	logger watermill.LoggerAdapter

	mu       sync.Mutex
	handlers map[string]*handlerSeen
}

// handlerSeen is what assembly knows of one handler.
type handlerSeen struct {
	marks   stack.Marks // the stages outside Classify, from its first delivery
	last    time.Time   // the last line about a failure nothing isolated
	pending int         // such failures since that line
}

// seen returns what is known of msg's handler, checking its assembly on
// its first delivery.
func (a *assembly) seen(msg *message.Message) *handlerSeen {
	ctx := msg.Context()
	name := telemetry.Handler(ctx)
	a.mu.Lock()
	h, ok := a.handlers[name]
	if !ok {
		h = &handlerSeen{marks: stack.Of(ctx)}
		a.handlers[name] = h
	}
	a.mu.Unlock()
	if !ok {
		a.check(msg, name, h.marks)
	}
	return h
}

// check logs, for the first delivery of handler, what its stack lacks.
func (a *assembly) check(msg *message.Message, handler string, marks stack.Marks) {
	var missing []string
	if marks&stack.Poison == 0 {
		missing = append(missing, "a poison stage (poison.New): a Poison or Invariant failure — a malformed message, a panic — is nacked, "+
			"and watermill-amqp and GoChannel deliver it again at once: a hot loop at the head of the queue, nothing isolated")
	}
	if marks&stack.Retry == 0 {
		missing = append(missing, "retry tiers (retrytiers.New): a Transient failure is nacked and delivered again at once, with no delay")
	}
	if len(missing) > 0 {
		a.logger.Info("Sluice's Classify stage has no stage outside it to act on what it classifies; add them outside Classify, "+
			"or build the stack with router.Add or service.New (docs/architecture.md)", watermill.LogFields{
			"handler": diag.Escape(handler), "missing": strings.Join(missing, "; ")})
	}
	if message.SubscriberNameFromCtx(msg.Context()) == watermillAMQPSubscriber {
		if _, ok := msg.Metadata[metakeys.SourceExchange]; !ok {
			a.logger.Info("The handler reads watermill-amqp's subscriber without Sluice's rabbitmq.Marshaler: with watermill-amqp's "+
				"DefaultMarshaler one header that is not a string — a Spring producer's integer, the x-death of every copy back from a "+
				"retry tier — fails before any stage runs and is nacked with requeue at once, a hot loop with the handler never run. "+
				"Give the subscriber's config to rabbitmq.WithMarshaler (README, \"A trap before the stages\")",
				watermill.LogFields{"handler": diag.Escape(handler)})
		}
	}
}

// isolated are the classes the poison stage isolates by default.
var isolated = []sluice.Class{sluice.ClassPoison, sluice.ClassInvariant, sluice.ClassExhausted}

// unisolated explains a failure of class that no stage outside Classify
// isolates, at most once per unisolatedLogInterval for its handler, with
// the number of such failures since the last line.
func (a *assembly) unisolated(msg *message.Message, h *handlerSeen, class sluice.Class, err error) {
	if h.marks&stack.Poison != 0 || !slices.Contains(isolated, class) ||
		errors.Is(err, sluice.ErrShutdown) {
		return
	}
	now := time.Now()
	a.mu.Lock()
	h.pending++
	n := h.pending
	if !h.last.IsZero() && now.Sub(h.last) < unisolatedLogInterval {
		a.mu.Unlock()
		return
	}
	h.last, h.pending = now, 0
	a.mu.Unlock()
	a.logger.Error("A "+class.String()+" failure, and no poison stage outside Classify to isolate it: the delivery is nacked and, "+
		"on watermill-amqp or GoChannel, delivered again at once, until the handler stops failing. Add poison.New outside Classify "+
		"(this line at most once a minute per handler)", diag.RedactError(err), diag.LogFields(telemetry.LogFields(msg, watermill.LogFields{
		"class": class.String(), "failures": n})))
}
