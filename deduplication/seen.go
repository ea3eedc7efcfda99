package deduplication

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Seen returns a probe of the inbox cfg configures (the same Config as the
// stage's): whether a message's key was processed already. It claims the
// key in a unit of work of its own and rolls it back whatever it finds,
// each call bounded as the stage's are (StoreTimeout, ClaimTimeout; group
// commit plays no part). A processed key is counted and logged as the
// stage's duplicates are, and sluice.OutcomeDuplicate is recorded in the
// message's report: the caller acks the message without running it.
//
// The ordering stage asks it before it holds a delivery behind its key's
// head (ordering.Config.Inbox; router.Add gives it Stages.Inbox): a
// redelivery of a message its key applied already — its process died
// after the commit and before the ack — is a duplicate, not a message to
// run after the head.
//
// A message without a valid key, or whose key another unit of work holds
// past ClaimTimeout, reports false (the stage decides when it runs); a
// store that fails reports its error.
func Seen(cfg Config) (func(msg *message.Message) (bool, error), error) {
	cfg.Batch = nil
	d, err := newDeduplicator(cfg, nil)
	if err != nil {
		return nil, err
	}
	return d.seen, nil
}

func (d *deduplicator) seen(msg *message.Message) (bool, error) {
	key, err := d.key(msg)
	if err != nil {
		return false, nil
	}
	ctx := msg.Context()
	tx, err := d.begin(ctx)
	if err != nil {
		return false, err
	}
	claimed, gaveUp, err := d.claim(ctx, tx, key)
	if !gaveUp { // a claim given up rolls tx back when it returns
		if rbErr := d.rollback(endContext(ctx), tx); err == nil && rbErr != nil {
			return false, rbErr
		}
	}
	switch {
	case errors.Is(err, ErrClaimInProgress):
		return false, nil
	case err != nil:
		return false, err
	case claimed:
		return false, nil
	}
	d.duplicate(msg, key)
	return true, nil
}
