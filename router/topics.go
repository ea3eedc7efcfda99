package router

import (
	"fmt"
	"runtime"
	"sync"
	"weak"

	"github.com/ThreeDotsLabs/watermill/message"
)

// consumed records, per router, which handler (by HandlerConfig.Name) Add
// gave each topic. A router's entry is dropped when the router is collected.
var consumed sync.Map // weak.Pointer[message.Router] → *topicOwners

type topicOwners struct {
	mu     sync.Mutex
	owners map[string]string // topic → handler name
}

// claimTopic records that the handler name consumes topic on r, or returns
// an error when another handler of r consumes it.
func claimTopic(r *message.Router, topic, name string) error {
	key := weak.Make(r)
	v, loaded := consumed.LoadOrStore(key, &topicOwners{owners: map[string]string{}})
	if !loaded {
		runtime.AddCleanup(r, func(k weak.Pointer[message.Router]) { consumed.Delete(k) }, key)
	}
	t := v.(*topicOwners)
	t.mu.Lock()
	defer t.mu.Unlock()
	if owner, ok := t.owners[topic]; ok && owner != name {
		return fmt.Errorf("router: topic %q is already consumed by handler %q on this router; a second handler %q would split its messages with it: %w",
			topic, owner, name, ErrDuplicateHandler)
	}
	t.owners[topic] = name
	return nil
}
