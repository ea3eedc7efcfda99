package testenv

import (
	"bytes"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// The frames a HeartbeatsOnly proxy forwards: every frame before it, only
// heartbeats after, a frame begun before it whole — whatever the pieces
// the replies arrive in.
func TestHeartbeatsOnlyForwardsWholeFrames(t *testing.T) {
	t.Parallel()
	frame := func(typ byte, payload string) []byte {
		return append(append([]byte{typ, 0, 1, 0, 0, 0, byte(len(payload))}, payload...), 0xCE)
	}
	heartbeat := frame(8, "")
	before := append(frame(1, "method"), heartbeat...)
	begun := frame(3, "body begun before")
	after := append(append(append(frame(1, "dropped"), heartbeat...), frame(3, "dropped too")...), heartbeat...)
	for cut := 1; cut <= len(before)+len(begun)+len(after); cut++ {
		p := &Proxy{}
		var s amqpFrames
		var out []byte
		pass := func(b []byte) { out = append(out, forwardInPieces(&s, p, b, cut)...) }
		pass(before)
		pass(begun[:5])
		p.HeartbeatsOnly()
		pass(begun[5:])
		pass(after)
		want := string(before) + string(begun) + string(heartbeat) + string(heartbeat)
		require.Equal(t, want, string(out), "cut %d", cut)
		require.Equal(t, 2, p.Heartbeats(), "cut %d", cut)
	}
}

// The frames a ChannelsSilent proxy forwards: channel 0's (the
// connection's), none of the channels', a frame begun before it whole —
// whatever the pieces; and a connection open when ChannelsAnswerOnNewConnections
// is called stays silent.
func TestChannelsSilentForwardsOnlyTheConnectionsFrames(t *testing.T) {
	t.Parallel()
	frame := func(typ byte, channel byte, payload string) []byte {
		return append(append([]byte{typ, 0, channel, 0, 0, 0, byte(len(payload))}, payload...), 0xCE)
	}
	heartbeat := frame(8, 0, "")
	before := append(frame(1, 1, "channel.open-ok"), frame(1, 0, "connection")...)
	begun := frame(3, 1, "body begun before")
	after := append(append(append(frame(1, 1, "basic.consume-ok"), heartbeat...), frame(1, 2, "channel.open-ok")...), frame(1, 0, "connection.blocked")...)
	for cut := 1; cut <= len(before)+len(begun)+len(after); cut++ {
		p := &Proxy{}
		var s amqpFrames
		s.link = &link{}
		var out []byte
		pass := func(b []byte) { out = append(out, forwardInPieces(&s, p, b, cut)...) }
		pass(before)
		pass(begun[:5])
		p.ChannelsSilent()
		pass(begun[5:])
		pass(after[:len(after)/2])
		p.links = []*link{s.link}
		p.ChannelsAnswerOnNewConnections()
		pass(after[len(after)/2:])
		want := string(before) + string(begun) + string(heartbeat) + string(frame(1, 0, "connection.blocked"))
		require.Equal(t, want, string(out), "cut %d", cut)
		require.Equal(t, 2, p.Silenced(), "cut %d", cut)
	}
}

// forwardInPieces is what s forwards of b arriving in pieces of cut bytes.
func forwardInPieces(s *amqpFrames, p *Proxy, b []byte, cut int) []byte {
	var out []byte
	for len(b) > 0 {
		k := min(cut, len(b))
		out = append(out, s.forward(bytes.Clone(b[:k]), p)...)
		b = b[k:]
	}
	return out
}

// SilenceChannelsFrom(2, 1): the first connection answers; the second
// forwards its channels' first frame and none after, the connection's
// frames all.
func TestSilenceChannelsFromSwallowsALaterConnectionsLaterFrames(t *testing.T) {
	t.Parallel()
	frame := func(channel byte, payload string) []byte {
		return append(append([]byte{1, 0, channel, 0, 0, 0, byte(len(payload))}, payload...), 0xCE)
	}
	replies := slices.Concat(frame(1, "channel.open-ok"), frame(0, "connection"), frame(1, "basic.qos-ok"), frame(2, "channel.open-ok"))
	p := &Proxy{}
	p.SilenceChannelsFrom(2, 1)
	for cut := 1; cut <= len(replies); cut++ {
		first, second := amqpFrames{link: &link{seq: 1}}, amqpFrames{link: &link{seq: 2}}
		require.Equal(t, string(replies), string(forwardInPieces(&first, p, replies, cut)), "cut %d", cut)
		want := string(slices.Concat(frame(1, "channel.open-ok"), frame(0, "connection")))
		require.Equal(t, want, string(forwardInPieces(&second, p, replies, cut)), "cut %d", cut)
	}
	require.Equal(t, 2*len(replies), p.Silenced())
}
