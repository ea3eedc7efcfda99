package testenv

import (
	"context"
	"time"
)

// StartAppPausing is StartApp with the pause after the first refused run.
func StartAppPausing(ctx context.Context, ctl Ctl, root string, pause time.Duration) (Boot, error) {
	return startApp(ctx, ctl, root, pause)
}

// AwaitBoot is awaitBoot, for a test that injects a node's refusal.
var AwaitBoot = awaitBoot

// PickPort is pickPort, PortLock portLock, EphemeralFirst ephemeralFirst
// and PortsFirst portsFirst.
var (
	PickPort       = pickPort
	PortLock       = portLock
	EphemeralFirst = ephemeralFirst
)

const PortsFirst = portsFirst
