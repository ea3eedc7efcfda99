package amqpframe

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// feed reads seg, whole frames, through f in pieces of cut bytes.
func feed(t *testing.T, f *filter, seg []byte, cut int) {
	t.Helper()
	r := &chunks{b: seg, cut: cut}
	p := make([]byte, cut+3)
	for len(r.b) > 0 || len(f.pend) > 0 || len(f.out) > 0 {
		if _, err := f.read(r, p); err != nil {
			t.Fatal(err)
		}
	}
}

// Heartbeats are not progress; a byte of any other frame is — a method, a
// content header (one too large to hold as well), a body — whatever the
// reads' sizes.
func TestOnlyFramesButHeartbeatsAreProgress(t *testing.T) {
	t.Parallel()
	heartbeats := bytes.Repeat(frameBytes(frameHeartbeat, 0, nil), 3)
	huge := frameBytes(frameHeader, 1, make([]byte, HeaderFrameMax))
	for _, cut := range []int{1, 2, 3, 7, 8, 9, 4096} {
		f := &filter{}
		for _, step := range []struct {
			name  string
			frame []byte
		}{
			{"a delivery", deliver(1, table{{"k", "v"}}.contents(), "body")},
			{"a method", method(1, 60, 72, shortstr(""))}, // basic.get-empty
			{"a body", frameBytes(3, 1, []byte{frameHeartbeat, frameHeartbeat})},
			{"a content header larger than HeaderFrameMax", huge},
		} {
			if step.name == "a content header larger than HeaderFrameMax" && cut < 4096 {
				continue
			}
			feed(t, f, heartbeats, cut)
			require.False(t, f.moved, "cut %d: heartbeats before %s", cut, step.name)
			feed(t, f, step.frame, cut)
			require.True(t, f.moved, "cut %d: %s", cut, step.name)
			f.moved = false
		}
	}
}

// A connection Config's dial wraps is in the registry while it is open:
// Progress finds it, and tells of the frames the call read; it leaves when
// the client closes it, when the broker's end goes (the read fails), and a
// handshake that fails leaves nothing. Not parallel: registered counts
// every test's connections.
func TestTheRegistryHoldsOpenConnectionsOnly(t *testing.T) {
	before := registered()
	var (
		conns []*amqp.Connection
		proxy *testenv.Proxy // the last connection's, alone
		url   string
	)
	for range 3 {
		proxy, url = testenv.ProxyAMQP(t)
		u, cfg, err := Config(url, amqp.Config{})
		require.NoError(t, err)
		c, err := amqp.DialConfig(u, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		conns = append(conns, c)
	}
	require.Equal(t, before+3, registered())

	start := time.Now()
	moved := Progress(conns[0])
	require.NotNil(t, moved)
	ch, err := conns[0].Channel() // channel.open-ok: a frame
	require.NoError(t, err)
	require.False(t, moved().Before(start), "the channel's opening moved it")
	_ = ch.Close()

	require.Nil(t, Progress(testenv.AMQP(t)), "a connection dialed without the filter is unknown")

	require.NoError(t, conns[1].Close())
	require.Nil(t, Progress(conns[1]))
	require.Equal(t, before+2, registered())

	closed := conns[2].NotifyClose(make(chan *amqp.Error, 1))
	proxy.Reset() // the broker's end goes: the client's read fails
	testenv.Within(t, time.Minute, "the client to see its connection cut", func() { <-closed })
	require.Nil(t, Progress(conns[2]))
	require.Equal(t, before+1, registered())

	bad, cfg2, err := Config(strings.Replace(url, "guest:guest", "guest:wrong", 1), amqp.Config{})
	require.NoError(t, err)
	_, err = amqp.DialConfig(bad, cfg2)
	require.True(t, errors.Is(err, amqp.ErrCredentials), "%v", err)
	require.Equal(t, before+1, registered(), "the failed handshake's connection left")

	require.NoError(t, conns[0].Close())
	require.Equal(t, before, registered())
}
