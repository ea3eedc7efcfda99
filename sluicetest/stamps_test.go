package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/service"
)

// The retry and poison stages stamp their copies on the kit's virtual
// clock, as the tiers and the inbox do: a delivery that first fails an hour
// into the test carries sluice_first_failed_at of that hour on its retry,
// and one poisoned then is sluice_poisoned_at that hour — not the wall
// clock's.
func TestTheStagesStampTheirCopiesOnTheVirtualClock(t *testing.T) {
	t.Parallel()
	firstFailedAt := make(chan string, 1)
	h := New(t, Config{Handler: service.Handler{Handler: func(msg *message.Message) error {
		attempt, _ := sluice.Attempt(msg)
		switch msg.Metadata.Get(sluice.EventIDKey) {
		case "evt-retried":
			if attempt <= 1 {
				return fmt.Errorf("card service: %w", context.DeadlineExceeded)
			}
			firstFailedAt <- msg.Metadata.Get(sluice.FirstFailedAtKey)
		case "evt-poisoned":
			return sluice.Invariant(errors.New("the account must exist"))
		}
		return nil
	}}})
	h.Advance(time.Hour)
	h.Publish("retried", Message("evt-retried", []byte(`{}`)))
	h.Publish("poisoned", Message("evt-poisoned", []byte(`{}`)))
	h.Settle()
	h.RequireOutcomes("retried", "retried to tier 1", "processed")
	h.RequirePoisoned("poisoned", sluice.ClassInvariant, nil)

	anHourIn := epoch.Add(time.Hour).Format(time.RFC3339Nano)
	require.Equal(t, anHourIn, <-firstFailedAt, "the retry copy's %s", sluice.FirstFailedAtKey)
	copies := h.emb.Poisoned()
	require.Len(t, copies, 1)
	require.Equal(t, anHourIn, copies[0].Metadata.Get(metakeys.PoisonedAt), "the poison copy's %s", metakeys.PoisonedAt)
	require.Equal(t, anHourIn, copies[0].Metadata.Get(sluice.FirstFailedAtKey), "the poison copy's %s", sluice.FirstFailedAtKey)
}
