package ordering_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/settle"
	"github.com/sluicemq/sluice/ordering"
)

// feed is a subscriber that hands out the messages the test sends it, in
// order, as a broker's consumer with a prefetch does (Serialize's input).
type feed struct{ ch chan *message.Message }

func (f feed) Subscribe(context.Context, string) (<-chan *message.Message, error) { return f.ch, nil }
func (f feed) Close() error                                                       { return nil }

func msg(key, id string) *message.Message {
	m := message.NewMessage(id, nil)
	m.Metadata.Set("account", key)
	m.Metadata.Set(sluice.EventIDKey, id)
	return m
}

// next returns the next message Serialize hands out, failing after a bound.
func next(t *testing.T, out <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m := <-out:
		return m
	case <-time.After(time.Minute):
		t.Fatal("nothing handed out")
		return nil
	}
}

// settled waits for m to be acked or nacked by Serialize itself; true when
// nacked.
func settled(t *testing.T, m *message.Message) bool {
	t.Helper()
	select {
	case <-m.Acked():
		return false
	case <-m.Nacked():
		return true
	case <-time.After(time.Minute):
		t.Fatalf("%s neither acked nor nacked", m.UUID)
		return false
	}
}

// nackedNow reports whether m is nacked already, without waiting.
func nackedNow(m *message.Message) bool {
	select {
	case <-m.Nacked():
		return true
	default:
		return false
	}
}

// serialized returns an Orderer on a MemoryStore keyed by "account", a
// feed and its Serialize view subscribed with ctx.
func serialized(t *testing.T, ctx context.Context) (*ordering.Orderer, feed, message.Subscriber, <-chan *message.Message) {
	t.Helper()
	o, err := ordering.New(ordering.Config{Store: ordering.NewMemoryStore(), Consumer: "ledger", Key: sluice.KeyFromMetadata("account")})
	require.NoError(t, err)
	in := feed{ch: make(chan *message.Message, 16)}
	sub := o.Serialize(in)
	out, err := sub.Subscribe(ctx, "q")
	require.NoError(t, err)
	return o, in, sub, out
}

// Serialize hands out one delivery of a key at a time, in the order they
// came, the keys side by side; a nacked delivery gives back the key's
// waiting ones and every later one until it comes back first; Close gives
// back what waits.
func TestSerializeOneKeyAtATime(t *testing.T) {
	t.Parallel()
	o, in, sub, out := serialized(t, t.Context())

	a1, b1, a2, b2 := msg("a", "a1"), msg("b", "b1"), msg("a", "a2"), msg("b", "b2")
	for _, m := range []*message.Message{a1, b1, a2, b2} {
		in.ch <- m
	}
	require.Equal(t, "a1", next(t, out).UUID)
	require.Equal(t, "b1", next(t, out).UUID, "another key runs beside a1")
	b1.Ack()
	require.Equal(t, "b2", next(t, out).UUID, "b's next once b1 is acked; a2 still waits for a1")

	// a1 given back (the brake, a shutdown): a2, waiting, is given back too,
	// and so is a3, which arrives before a1 comes back.
	a1.Nack()
	require.True(t, settled(t, a2), "a2 given back behind a1")
	a3 := msg("a", "a3")
	in.ch <- a3
	require.True(t, settled(t, a3), "a3 given back until a1 comes back")
	a1again := msg("a", "a1")
	in.ch <- a1again
	require.Equal(t, "a1", next(t, out).UUID, "the given-back delivery, first")
	a2again := msg("a", "a2")
	in.ch <- a2again
	a1again.Ack()
	require.Equal(t, "a2", next(t, out).UUID)
	a2again.Ack()
	b2.Ack()

	// Close gives back what waits — c2 behind c1, never handed out — once
	// c1 is settled: were c1 nacked after c2, the broker would give c2
	// back first, and the view after a restart would run c2 before c1.
	c1, c2 := msg("c", "c1"), msg("c", "c2")
	in.ch <- c1
	in.ch <- c2
	require.Equal(t, "c1", next(t, out).UUID)
	stopped := make(chan struct{})
	ordering.OnStopped(sub, func() { close(stopped) })
	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case <-stopped: // the view gave back what it gives back before c1 is settled
	case <-time.After(time.Minute):
		t.Fatal("the view did not begin stopping")
	}
	require.False(t, nackedNow(c2), "c2 given back before c1 is settled")
	c1.Ack()
	require.True(t, settled(t, c2), "c2 given back at Close, once c1 is settled")
	close(in.ch)
	require.NoError(t, <-closed)
	_, open := <-out
	require.False(t, open, "the view's channel closes")
	require.NoError(t, o.Close())
}

// heardLate returns a view fed by in, handing out on out, whose first
// settlement of a delivery handed out is heard only once release is
// closed: the goroutine that watches it not yet run, as on a loaded
// machine. A send on in returns once the view took the message.
func heardLate(t *testing.T) (o *ordering.Orderer, in feed, sub message.Subscriber, out <-chan *message.Message, release chan struct{}) {
	t.Helper()
	o, err := ordering.New(ordering.Config{Store: ordering.NewMemoryStore(), Consumer: "ledger", Key: sluice.KeyFromMetadata("account")})
	require.NoError(t, err)
	in = feed{ch: make(chan *message.Message)}
	sub = o.Serialize(in)
	release = make(chan struct{})
	var hold sync.Once
	ordering.OnReporting(sub, func() { hold.Do(func() { <-release }) })
	out, err = sub.Subscribe(t.Context(), "q")
	require.NoError(t, err)
	return o, in, sub, out, release
}

// A given-back delivery the broker sends again at once can reach the view
// before the view has heard of its own nack (the goroutine that watches it
// not yet run, as on a loaded machine): it is the key's head, given back
// and awaited, handed out again — not a delivery waiting behind itself,
// given back a second time with every delivery of its key when the nack is
// heard. Before, on a quorum queue, each such race cost every delivery of
// the key one more return toward x-delivery-limit (all 16 at 13 after the
// head was given back 12 times: router's
// TestAKeysGivenBackDeliveriesSpendNoMoreReturnsThanItsHead in a loaded
// run at 021f694).
func TestAHeadBackBeforeItsNackIsHeardIsHandedOut(t *testing.T) {
	t.Parallel()
	o, in, sub, out, release := heardLate(t)

	a1, a2 := msg("a", "a1"), msg("a", "a2")
	in.ch <- a1
	in.ch <- a2
	require.Equal(t, "a1", next(t, out).UUID)
	a1.Nack() // given back; its watcher held before it tells the view
	again := msg("a", "a1")
	in.ch <- again // the broker sent it again at once: the view has it
	close(release)
	select {
	case m := <-out:
		require.Same(t, again, m, "the given-back head, handed out again")
	case <-again.Nacked():
		t.Fatal("the head, back, was given back again: taken for a delivery waiting behind its own nack")
	case <-time.After(time.Minute):
		t.Fatal("nothing handed out")
	}
	require.True(t, settled(t, a2), "a2, waiting behind the head, given back after it")
	again.Ack()
	close(in.ch)
	require.NoError(t, sub.Close())
	require.NoError(t, o.Close())
}

// A later delivery of the key that reaches the view after the head was
// nacked, but before the view has heard of that nack, waits behind the
// head and goes back after it — after the head's nack has reached the
// broker — as every delivery waiting behind a given-back head does. (The
// first fix of the test above settled the key's head first on any arrival
// of its key: the later delivery then went back at once, out of turn, its
// nack possibly at the broker before the head's; back first, it was given
// back again — one return more than its head: router's
// TestAKeysGivenBackDeliveriesSpendNoMoreReturnsThanItsHead, 1 of 10 at
// 55fe900, all 15 at 13 with the head at 12.)
func TestALaterDeliveryBeforeItsHeadsNackIsHeardWaitsBehindIt(t *testing.T) {
	t.Parallel()
	o, in, sub, out, release := heardLate(t)

	a1 := msg("a", "a1")
	a1Sent := make(chan struct{}) // closed once "the subscriber" has sent a1's nack
	a1.SetContext(settle.WithSent(a1.Context(), a1Sent))
	in.ch <- a1
	require.Equal(t, "a1", next(t, out).UUID)
	a1.Nack() // given back; its watcher held before it tells the view
	a2 := msg("a", "a2")
	in.ch <- a2 // a later delivery of the key, before the view heard of a1's nack
	b1 := msg("b", "b1")
	in.ch <- b1
	require.Equal(t, "b1", next(t, out).UUID) // the view is past a2: it gave a2 back then, or queued it
	select {
	case <-a2.Nacked():
		t.Fatal("a2 given back at once, out of turn, before its head's nack was sent")
	case <-a2.Acked():
		t.Fatal("a2 acked")
	default:
	}
	close(release)
	close(a1Sent)
	require.True(t, settled(t, a2), "a2, waiting behind its head, given back after it")

	// Back in the order they were given back: each handed out in its turn,
	// neither given back again.
	a1again, a2again := msg("a", "a1"), msg("a", "a2")
	in.ch <- a1again
	require.Equal(t, "a1", next(t, out).UUID)
	in.ch <- a2again
	a1again.Ack()
	require.Equal(t, "a2", next(t, out).UUID)
	a2again.Ack()
	b1.Ack()
	close(in.ch)
	require.NoError(t, sub.Close())
	require.NoError(t, o.Close())
}

// A delivery's key is read once: Serialize reads it (a JSON key parses the
// payload) and Middleware takes what Serialize read.
func TestTheKeyIsReadOnce(t *testing.T) {
	t.Parallel()
	reads := 0
	key := func(m *message.Message) (string, error) { reads++; return sluice.KeyFromMetadata("account")(m) }
	o, err := ordering.New(ordering.Config{Store: ordering.NewMemoryStore(), Consumer: "ledger", Key: key})
	require.NoError(t, err)
	in := feed{ch: make(chan *message.Message, 1)}
	sub := o.Serialize(in)
	out, err := sub.Subscribe(t.Context(), "q")
	require.NoError(t, err)
	in.ch <- msg("a", "a1")
	m := next(t, out)
	handled := false
	_, err = o.Middleware(func(*message.Message) ([]*message.Message, error) { handled = true; return nil, nil })(m)
	require.NoError(t, err)
	require.True(t, handled)
	require.Equal(t, 1, reads)
	m.Ack()
	close(in.ch)
	require.NoError(t, sub.Close())
	require.NoError(t, o.Close())
}

// A delivery given back (a failed lock, a failed block, the brake) gives
// back the key's deliveries that wait behind it, and the broker redelivers
// them in the order their nacks reach it — each is sent on its own, and a
// requeued delivery goes out at once while the consumer has room — so a
// later one can come back before an earlier one: Serialize hands them out
// in the order it gave them back, each in its turn, giving back again what
// comes out of turn. (Before, it awaited only the first: a-2, given back
// again while a-1 was awaited, came back after a-3, and ran after it: the
// 0…15 17 18 16 19 of router.TestOrderPerKeyThroughRetries.)
func TestSerializeHandsOutWhatItGaveBackInItsOrder(t *testing.T) {
	t.Parallel()
	o, in, sub, out := serialized(t, t.Context())

	a1, a2, a3 := msg("a", "a-1"), msg("a", "a-2"), msg("a", "a-3")
	for _, m := range []*message.Message{a1, a2, a3} {
		in.ch <- m
	}
	require.Equal(t, "a-1", next(t, out).UUID)
	a1.Nack()
	require.True(t, settled(t, a2), "a-2 given back behind a-1")
	require.True(t, settled(t, a3), "a-3 given back behind a-1")

	// a-2's nack reached the broker first: it comes back before a-1, and is
	// given back again.
	a2again := msg("a", "a-2")
	in.ch <- a2again
	require.True(t, settled(t, a2again), "a-2 before a-1: given back again")
	a1again := msg("a", "a-1")
	in.ch <- a1again
	require.Equal(t, "a-1", next(t, out).UUID)
	// a-3 comes back before a-2's second return.
	a3again := msg("a", "a-3")
	in.ch <- a3again
	require.True(t, settled(t, a3again), "a-3 before a-2: given back again")
	a2third := msg("a", "a-2")
	in.ch <- a2third
	a3third := msg("a", "a-3")
	in.ch <- a3third
	a1again.Ack()
	require.Equal(t, "a-2", next(t, out).UUID, "a-2, in its turn")
	a2third.Ack()
	require.Equal(t, "a-3", next(t, out).UUID)
	a3third.Ack()

	// Once all are back, the key's new deliveries pass as before.
	a4 := msg("a", "a-4")
	in.ch <- a4
	require.Equal(t, "a-4", next(t, out).UUID)
	a4.Ack()

	close(in.ch)
	require.NoError(t, sub.Close())
	require.NoError(t, o.Close())
}
