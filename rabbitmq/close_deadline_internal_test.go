package rabbitmq

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A deadline set with SetDeadline (amqp091-go's CloseDeadline) bounds
// reads even when the heartbeater moves the read deadline later after
// each frame: the close waits for close-ok no longer than it. Lifted by
// SetDeadline's zero time (the end of the handshake).
func TestDeadlineConnKeepsTheCloseDeadline(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	c := &deadlineConn{Conn: a, timeout: time.Minute}
	require.NoError(t, c.SetDeadline(time.Now().Add(50*time.Millisecond)))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Hour))) // the heartbeater's
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	require.Less(t, time.Since(start), 30*time.Second)

	require.NoError(t, c.SetDeadline(time.Time{}))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Hour)))
	go func() { _, _ = b.Write([]byte{1}) }()
	_, err = c.Read(make([]byte, 1))
	require.NoError(t, err, "no deadline kept once lifted")
}
