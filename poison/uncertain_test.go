package poison_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/poison"
)

// A poison queue that refuses the copy for certain (full, unroutable) has
// it parked; a publish whose outcome is uncertain (no confirm, the channel
// closed first) does not: the copy may already be in the poison queue, and
// a parked one would come back as a second entry. The delivery is nacked
// after the backoff.
func TestUncertainPublishIsNotParked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		parked bool
	}{
		{"certain refusal", errors.New("rabbitmq: broker nacked the message"), true},
		{"uncertain", fmt.Errorf("%w: no confirm within the confirm timeout", sluice.ErrPublishUncertain), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			park := &recorder{}
			mw, err := poison.New(poison.Config{Publisher: &recorder{fail: tc.err}, Topic: "orders.poison",
				ParkTopic: "orders.retry.30s", ParkPublisher: park, Env: sluice.Env{PublishBackoff: 30 * time.Millisecond}})
			require.NoError(t, err)
			start := time.Now()
			err = run(mw, message.NewMessage("u", nil), sluice.Poison(errors.New("unknown version 7")))
			if tc.parked {
				require.NoError(t, err, "parked: the original is acked")
				require.Len(t, park.got, 1)
				return
			}
			require.ErrorIs(t, err, sluice.ErrPublishUncertain, "nacked: the broker delivers it again")
			require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "after the backoff")
			require.Empty(t, park.got, "no second copy parked")
		})
	}
}

// Two deliveries of one message make poison copies with one identity
// (message UUID and sluice.CopyIDKey): counted as one item. A parked copy
// keeps it when it comes back and goes to the poison queue.
func TestPoisonCopiesOfOneDeliveryShareAnIdentity(t *testing.T) {
	t.Parallel()
	pub := &recorder{}
	mw, err := poison.New(poison.Config{Publisher: pub, Topic: "orders.poison", Env: sluice.Env{PublishBackoff: time.Millisecond}})
	require.NoError(t, err)
	for range 2 {
		m := message.NewMessage("u1", []byte("payload"))
		require.NoError(t, run(mw, m, sluice.Poison(errors.New("unknown version 7"))))
	}
	require.Len(t, pub.got, 2)
	require.NotEqual(t, "u1", pub.got[0].UUID)
	require.Equal(t, pub.got[0].UUID, pub.got[1].UUID)
	require.Equal(t, pub.got[0].UUID, pub.got[1].Metadata.Get(sluice.CopyIDKey))

	park := &recorder{}
	refusing := &recorder{fail: errors.New("rabbitmq: broker nacked the message")}
	mw, err = poison.New(poison.Config{Publisher: refusing, Topic: "orders.poison",
		ParkTopic: "orders.retry.30s", ParkPublisher: park, Env: sluice.Env{PublishBackoff: time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, run(mw, message.NewMessage("u1", []byte("payload")), sluice.Poison(errors.New("unknown version 7"))))
	require.Len(t, park.got, 1)
	parked := park.got[0]
	require.Equal(t, pub.got[0].UUID, parked.UUID, "parked or not, one identity")

	back := parked.Copy()
	back.Metadata.Set(metakeys.DeadLetterQueue, "orders.retry.30s")
	back.Metadata.Set(metakeys.DeadLetterReason, metakeys.DeadLetterExpired)
	refusing.fail = nil
	require.NoError(t, run(mw, back, errors.New("the handler does not run")))
	require.Len(t, refusing.got, 1)
	require.Equal(t, parked.UUID, refusing.got[0].UUID, "the parked copy keeps its identity in the poison queue")
	require.Equal(t, parked.UUID, refusing.got[0].Metadata.Get(sluice.CopyIDKey))
}
