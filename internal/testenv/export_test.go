package testenv

import (
	"context"
	"path/filepath"
	"strconv"
	"time"
)

// StartAppPausing is StartApp with the pause after the first refused run.
func StartAppPausing(ctx context.Context, ctl Ctl, root string, pause time.Duration) (Boot, error) {
	return startApp(ctx, ctl, root, pause)
}

// AwaitBoot is awaitBoot, for a test that injects a node's refusal.
var AwaitBoot = awaitBoot

// PickPort is pickPort; PortLock is the file a port's reservation locks.
var PickPort = pickPort

func PortLock(port int) string { return filepath.Join(portLocks, strconv.Itoa(port)) }
