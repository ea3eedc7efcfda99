//go:build !linux

package postgres

import (
	"syscall"
	"time"
)

// userTimeout: TCP_USER_TIMEOUT is Linux's; elsewhere keepalive alone.
func userTimeout(time.Duration) func(network, address string, c syscall.RawConn) error { return nil }
