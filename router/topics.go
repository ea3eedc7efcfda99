package router

import (
	"fmt"
	"runtime"
	"sync"
	"weak"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/brake"
)

// added records, per router, what Add gave it: which handler (by
// HandlerConfig.Name) consumes each topic, and each handler's brake. A
// router's entry is dropped when the router is collected.
var added sync.Map // weak.Pointer[message.Router] → *registry

type registry struct {
	mu     sync.Mutex
	owners map[string]string       // topic → handler name
	brakes map[string]*brake.Brake // handler name → its brake
}

// registryOf returns r's registry, creating it.
func registryOf(r *message.Router) *registry {
	key := weak.Make(r)
	v, loaded := added.LoadOrStore(key, &registry{owners: map[string]string{}, brakes: map[string]*brake.Brake{}})
	if !loaded {
		runtime.AddCleanup(r, func(k weak.Pointer[message.Router]) { added.Delete(k) }, key)
	}
	return v.(*registry)
}

// claimTopic records that the handler name consumes topic on r, or returns
// an error when another handler of r consumes it.
func claimTopic(r *message.Router, topic, name string) error {
	t := registryOf(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	if owner, ok := t.owners[topic]; ok && owner != name {
		return fmt.Errorf("router: topic %q is already consumed by handler %q on this router; a second handler %q would split its messages with it: %w",
			topic, owner, name, errDuplicateHandler)
	}
	t.owners[topic] = name
	return nil
}

// Brake returns the brake Add built for the handler named name on r
// (HandlerConfig.Name, shared by its consumers), or nil when Add built none
// there: its State and Engaged tell whether the handler is consuming, as a
// health check wants. Safe for concurrent use.
func Brake(r *message.Router, name string) *brake.Brake {
	t := registryOf(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.brakes[name]
}

func recordBrake(r *message.Router, name string, b *brake.Brake) {
	t := registryOf(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.brakes[name] = b
}
