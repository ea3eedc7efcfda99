package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// A private instance's port is picked free here and bound by the instance
// seconds later. Picked by the kernel (a listener on port 0, closed), it
// could be handed to another test binary's instance, or to a connection as
// its ephemeral port, in between: RabbitMQ then boots without a TLS
// listener it could not bind (TestCLIOverTLS read another listener on its
// node's TLS port, once in ten runs) and PostgreSQL does not start. So
// ports come from below the kernel's ephemeral range, which it never hands
// out for port 0 or to a connection, each reserved across the suite's
// processes by a lock on a file of its own, held until the process exits.
var ports struct {
	sync.Mutex
	held []*os.File // the reservations' locks, kept open
}

// portsFirst is the first port picked from; the last is below the
// ephemeral range (ip_local_port_range), or 32767 if it cannot be read.
// The scripts' fixed ports (25672, 25682, the cluster's 2578x) are below.
const portsFirst = 26000

// portLocks is where the reservations' lock files are.
var portLocks = filepath.Join(os.TempDir(), "sluice-ports")

// portLock is the file port's reservation locks.
func portLock(port int) string { return filepath.Join(portLocks, strconv.Itoa(port)) }

// portLocksReady makes portLocks, once: every user's runs share the
// reservations, the directory theirs to add to (sticky, as /tmp), the
// files theirs to lock (read only).
var portLocksReady = sync.OnceValue(func() error {
	if err := os.MkdirAll(portLocks, 0o777); err != nil {
		return fmt.Errorf("picking a port: %w", err)
	}
	if info, err := os.Stat(portLocks); err == nil && info.Mode().Perm() != 0o777 {
		_ = os.Chmod(portLocks, 0o777|os.ModeSticky)
	}
	return nil
})

// pickPort returns a port free on 127.0.0.1 now, reserved for this
// process: no other pickPort, in this process or another, returns it
// while this one runs.
func pickPort() (int, error) {
	last := ephemeralFirst() - 1
	if last-portsFirst < 1000 {
		return kernelPort() // no room below the ephemeral range: take the kernel's
	}
	if err := portLocksReady(); err != nil {
		return 0, err
	}
	n := last - portsFirst + 1
	start := rand.IntN(n)
	for i := range n {
		port := portsFirst + (start+i)%n
		ok, err := reserve(port)
		if err != nil {
			return 0, err
		}
		if ok {
			return port, nil
		}
	}
	return 0, fmt.Errorf("picking a port: every port of %d-%d is reserved or in use", portsFirst, last)
}

// reserve locks port's file and checks that nothing listens on it; it
// keeps the lock if so.
func reserve(port int) (bool, error) {
	f, err := lockFile(portLock(port))
	if errors.Is(err, os.ErrPermission) {
		return false, nil // another user's file we cannot read: taken, as far as we know
	}
	if err != nil {
		return false, fmt.Errorf("picking a port: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // another pick holds it
		}
		return false, fmt.Errorf("picking a port: locking %s: %w", f.Name(), err)
	}
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		_ = f.Close() // in use by something outside the suite
		return false, nil
	}
	_ = l.Close()
	ports.Lock()
	ports.held = append(ports.held, f)
	ports.Unlock()
	return true, nil
}

// lockFile opens name to lock it: read only (flock needs no more),
// readable by every user when this process creates it.
func lockFile(name string) (*os.File, error) {
	f, err := os.Open(name)
	if !errors.Is(err, os.ErrNotExist) {
		return f, err
	}
	f, err = os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if errors.Is(err, os.ErrExist) { // another pick made it meanwhile
		return os.Open(name)
	}
	return f, err
}

// ephemeralFirst returns the first port of the kernel's ephemeral range.
func ephemeralFirst() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	first, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return first
}

// kernelPort is a port the kernel picks: free now, not reserved.
func kernelPort() (int, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
