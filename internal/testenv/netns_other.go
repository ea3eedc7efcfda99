//go:build !linux

package testenv

import (
	"context"
	"errors"
	"net"
)

// DialContext connects to addr from inside the cluster's network
// namespace: Linux only.
func (c *PrivateCluster) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("testenv: network namespaces are Linux's")
}
