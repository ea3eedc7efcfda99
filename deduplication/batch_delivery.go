package deduplication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/unitctx"
	"github.com/sluicemq/sluice/unitofwork"
)

// handle runs msg's claim and handler in a batch. handled false: msg left
// the batch before its claim (its turn did not come within QueueTimeout,
// its key is claimed in the batch, or the store cannot batch) and must run
// in a unit of work of its own.
func (bt *batcher) handle(msg *message.Message, key string, h message.HandlerFunc) (produced []*message.Message, err error, handled bool) {
	d := bt.d
	if !bt.cleared(key) {
		return nil, nil, false
	}
	b := bt.join()
	inBatch := true
	leave := func() {
		if inBatch {
			inBatch = false
			b.mu.Lock()
			b.active--
			if b.active == 0 {
				select {
				case b.idle <- struct{}{}:
				default: // already signalled
				}
			}
			b.mu.Unlock()
		}
	}
	defer leave()
	<-b.ready // Begin is bounded by StoreTimeout
	if b.err != nil {
		if errors.Is(b.err, errNoSavepoints) {
			return nil, nil, false
		}
		return nil, sluice.Transient(b.err), true
	}

	t := time.NewTimer(bt.cfg.QueueTimeout)
	select {
	case <-b.turn:
		t.Stop()
	case <-t.C:
		return nil, nil, false
	}
	holding := true
	release := func() {
		if holding {
			holding = false
			b.turn <- struct{}{}
		}
	}
	defer release()

	ctx := msg.Context()
	b.mu.Lock()
	broken := b.broken
	_, again := b.keys[key]
	b.mu.Unlock()
	if broken != nil {
		return nil, sluice.Transient(broken), true
	}
	if again { // the same key claimed earlier in this batch: decided by its commit
		release()
		leave()
		<-b.done
		return nil, nil, false
	}
	sp := "sluice_" + strconv.Itoa(b.next)
	b.next++
	claimed, gaveUp, err := b.savepointAndClaim(ctx, sp, key)
	switch {
	case gaveUp:
		b.breakWith(err)
		return nil, sluice.Transient(err), true
	case b.claimer != nil && errors.Is(err, ErrClaimInProgress):
		return nil, nil, false // held elsewhere: wait for it alone (ClaimTimeout)
	case err != nil:
		return nil, sluice.Transient(err), true
	case !claimed:
		b.undo(ctx, sp)
		d.duplicate(msg, key)
		return nil, nil, true
	}
	b.mu.Lock()
	b.keys[key] = struct{}{}
	b.mu.Unlock()
	forget := func() {
		b.mu.Lock()
		delete(b.keys, key)
		b.mu.Unlock()
	}

	u := unitctx.New[unitofwork.Tx](ctx, b.tx, msg.Metadata.Get(sluice.EventIDKey))
	msg.SetContext(u)
	panicked := true
	defer func() {
		if panicked { // roll back to the savepoint, then let it unwind
			msg.SetContext(ctx)
			b.undo(ctx, sp)
			forget()
		}
	}()
	produced, err = h(msg)
	panicked = false
	msg.SetContext(ctx)
	rejected := err != nil
	if rejected && d.cfg.Classifier.Classify(err) != sluice.ClassRejected {
		b.undo(ctx, sp)
		forget()
		if lockConflict(err) { // the batch's locks' doing: not the delivery's attempt
			return nil, nil, false
		}
		return produced, err, true
	}
	m := &member{sp: sp, key: key}
	// Kept: wait for the batch's commit, and return what it decided.
	kept := func() ([]*message.Message, error, bool) {
		b.mu.Lock()
		b.kept++
		if b.attrs == nil {
			b.attrs = telemetry.DeliveryAttr(msg)
		}
		b.mu.Unlock()
		release()
		leave()
		<-b.done
		switch {
		case m.err != nil:
			return nil, m.err, true
		case b.commitErr != nil && commitOfTheBatch(b.commitErr):
			return nil, nil, false // rolled back: run again alone, at once
		case b.commitErr != nil:
			return nil, sluice.Transient(errors.Join(err, fmt.Errorf("deduplication: commit: %w", b.commitErr))), true
		}
		u.Committed()
		return produced, err, true
	}
	if !rejected && b.claimer != nil {
		b.pending = m // released with the next delivery's claim, or by the commit
		return kept()
	}
	if rerr := b.exec(ctx, func(ctx context.Context) error { return b.sp.Release(ctx, sp) }); rerr != nil {
		b.undo(ctx, sp)
		if !rejected || !errors.Is(rerr, unitofwork.ErrAborted) {
			forget()
			return nil, sluice.Transient(errors.Join(err, fmt.Errorf("deduplication: commit: %w", rerr))), true
		}
		// A rejection after a statement that aborted the transaction: its
		// claim alone, with what it produced (unitofwork.OnRecordAlone), as without
		// batching.
		if aerr := b.recordAlone(ctx, sp, key, u); aerr != nil {
			forget()
			if errors.Is(aerr, errProcessedMeanwhile) {
				d.duplicate(msg, key)
				return nil, nil, true
			}
			return nil, sluice.Transient(errors.Join(err, aerr)), true
		}
	}
	return kept()
}

// recordAlone claims key again after the unit of work was rolled back to
// sp, with the writes registered by unitofwork.OnRecordAlone.
func (b *batch) recordAlone(ctx context.Context, sp, key string, u *unitctx.Unit[unitofwork.Tx]) error {
	d := b.bt.d
	claimed, gaveUp, err := d.claim(ctx, b.tx, key)
	if err != nil {
		if gaveUp {
			b.breakWith(err)
		} else {
			b.undo(ctx, sp)
		}
		return fmt.Errorf("deduplication: recording the rejection: %w", err)
	}
	if !claimed { // a redelivery processed the key meanwhile (see claimAlone)
		b.undo(ctx, sp)
		return errProcessedMeanwhile
	}
	for _, write := range u.Rewrites() {
		if err := write(endContext(ctx), b.tx); err != nil {
			b.undo(ctx, sp)
			return fmt.Errorf("deduplication: writing again what the rejected handler wrote for its commit: %w", err)
		}
	}
	if err := b.exec(ctx, func(ctx context.Context) error { return b.sp.Release(ctx, sp) }); err != nil {
		b.undo(ctx, sp)
		return fmt.Errorf("deduplication: recording the rejection: %w", err)
	}
	return nil
}
