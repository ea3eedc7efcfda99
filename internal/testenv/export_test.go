package testenv

import "time"

// SetStartAppPause sets StartApp's pause between refused runs for a test.
func SetStartAppPause(d time.Duration) { startAppPause = d }

// AwaitBoot is awaitBoot, for a test that injects a node's refusal.
var AwaitBoot = awaitBoot
