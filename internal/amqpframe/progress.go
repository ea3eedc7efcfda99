package amqpframe

import (
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// registryMax bounds how many connections the registry holds: a process
// with more open at once (a socket each) reads no progress on the others,
// whose calls keep a fixed bound (Progress). Far past what one process
// opens to a broker; it bounds the registry's memory if connections are
// never closed.
const registryMax = 1 << 16

// epoch is what Conn's times count from: a monotonic reading, so that a
// change of the wall clock moves no call's deadline.
var epoch = time.Now()

// registry is every open Conn, by its socket's two addresses: what an
// *amqp.Connection tells of the socket under it (LocalAddr, RemoteAddr).
// It starts no goroutine: a Conn joins it when NewConn wraps a socket and
// leaves it when closed or when a read fails — amqp091-go closes the
// socket of a connection that ends, a failed handshake's included.
var registry = struct {
	sync.Mutex
	conns map[string][]*Conn // more than one: two sockets of the same addresses (network namespaces), neither found
	n     int
}{conns: map[string][]*Conn{}}

// key is the registry's key for a socket of these addresses.
func key(local, remote interface{ String() string }) string {
	if local == nil || remote == nil {
		return ""
	}
	return local.String() + " " + remote.String()
}

func register(c *Conn) {
	k := key(c.LocalAddr(), c.RemoteAddr())
	if k == "" {
		return
	}
	registry.Lock()
	defer registry.Unlock()
	if registry.n >= registryMax {
		return
	}
	c.key = k
	registry.conns[k] = append(registry.conns[k], c)
	registry.n++
}

// leave takes c out of the registry, once.
func (c *Conn) leave() {
	if c.key == "" || c.gone.Swap(true) {
		return
	}
	registry.Lock()
	defer registry.Unlock()
	cs := slices.DeleteFunc(registry.conns[c.key], func(o *Conn) bool { return o == c })
	if len(cs) == 0 {
		delete(registry.conns, c.key)
	} else {
		registry.conns[c.key] = cs
	}
	registry.n--
}

// Progress returns a function that tells when conn last read a byte of a
// frame other than a heartbeat — the broker's answers moving, where a
// heartbeat says only that the broker's connection process is alive — for
// a connection whose socket NewConn wraps (rabbitmq.Dial's, Config's); nil
// for any other (amqp.Dial's) or for one closed, whose waits keep a fixed
// bound. conn's frames count whatever channel they are on.
func Progress(conn *amqp.Connection) func() time.Time {
	k := key(conn.LocalAddr(), conn.RemoteAddr())
	registry.Lock()
	cs := registry.conns[k]
	registry.Unlock()
	if len(cs) != 1 {
		return nil
	}
	c := cs[0]
	return func() time.Time { return epoch.Add(time.Duration(c.moved.Load())) }
}

// registered is how many connections the registry holds.
func registered() int {
	registry.Lock()
	defer registry.Unlock()
	return registry.n
}
