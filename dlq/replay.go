package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/time/rate"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/replay"
)

// ReplayConfig configures Queue.Replay and Queue.ClosedLoop.
type ReplayConfig struct {
	Filter Filter
	Limit  int     // at most this many messages replayed (0: no limit)
	Rate   float64 // messages per second (0: no limit)
	Batch  int     // messages published, confirmed and acked together; default 10
	DryRun bool    // select and count, change nothing
	To     string  // replay every message to this queue instead of its sluice_poison_queue
	// Run, when set, is the replay run: each copy carries replay.RunKey and
	// replay.ItemKey (Message.Item).
	Run string
	// Published, when set, is called with each group of a batch (the
	// messages to one target) once its publish is confirmed, before the
	// originals are acked: the replay's one report of what it moved as it
	// goes — a run's record of what was sent (an item is recorded only if
	// it was sent; if the process dies before the record, the consumer's own
	// record of its outcome creates it), or a progress count (the sum of
	// len(ms) so far). Its context is not cancelled by an interrupt
	// (afterConfirm); an error stops the replay, the group published and
	// still in the poison queue. A dry run calls it for none.
	Published func(context.Context, []*Message) error
	// Targets are the queues the replay may publish to: To, and the queue
	// each message names (its sluice_poison_queue, a header anyone who can
	// publish to the poison queue can write), must be one of them, or the
	// message is refused (ErrTargetRefused) — in a dry run too, with or
	// without a Config.Signer. Empty: To is taken as given (the operator named it),
	// and a message's own queue only when it is of the poison queue's
	// family by name (its name without ".poison", and its partition queues).
	Targets []string

	queue string // the poison queue: the Queue's, set by its methods
	op    Config // the Queue's, set by its methods
}

// ErrUnreadable is returned for a selected message whose headers the AMQP
// client could not parse: a replay would drop them.
var ErrUnreadable = errors.New("dlq: message's headers could not be read, so it is not replayed (a replay would drop them): inspect it, then archive or discard it")

// replayOn is Queue.Replay on conn's queue (cfg.queue).
func replayOn(ctx context.Context, conn *amqp.Connection, cfg ReplayConfig) (Result, error) {
	res := Result{ByTarget: map[string]int{}}
	if cfg.Batch <= 0 {
		cfg.Batch = 10
	}
	var limiter *rate.Limiter
	if cfg.Rate > 0 {
		limiter = rate.NewLimiter(rate.Limit(cfg.Rate), max(1, min(cfg.Batch, int(cfg.Rate))))
	}
	var batch []*Message
	exists := map[string]error{}
	plan := func() error { // a dry run checks every target, changes nothing
		for _, m := range batch {
			t, err := cfg.target(m)
			if err != nil {
				return err
			}
			if _, checked := exists[t]; !checked {
				exists[t] = queueExists(conn, t)
			}
			if err := exists[t]; err != nil {
				return fmt.Errorf("dlq: %s: target %w", m.name(), err)
			}
			res.ByTarget[t]++
			res.Plan = append(res.Plan, Planned{Message: m.name(), Target: t})
		}
		batch = batch[:0]
		return nil
	}
	flush := func() error {
		if cfg.DryRun {
			return plan()
		}
		if len(batch) == 0 {
			return nil
		}
		// Group by target, publish each group with confirms, then ack it.
		groups := map[string][]*Message{}
		var order []string
		for _, m := range batch {
			t, err := cfg.target(m)
			if err != nil {
				return err
			}
			if _, ok := groups[t]; !ok {
				order = append(order, t)
			}
			groups[t] = append(groups[t], m)
		}
		for _, target := range order {
			ms := groups[target]
			copies := make([]*message.Message, len(ms))
			for i, m := range ms {
				copies[i] = replayCopy(m, cfg, target)
			}

			if limiter != nil {
				for range ms {
					if err := limiter.Wait(ctx); err != nil {
						return err
					}
				}
			}
			if err := cfg.op.Publisher.Publish(target, copies...); err != nil {
				return fmt.Errorf("dlq: replaying to %s: %w", diag.Printable(target, 255), err)
			}
			if cfg.Published != nil {
				actx, cancel := afterConfirm(ctx)
				err := cfg.Published(actx, ms)
				cancel()
				if err != nil {
					return fmt.Errorf("dlq: recording the replayed items (published, still in %s): %w", diag.Printable(cfg.queue, 255), err)
				}
			}
			for _, m := range ms {
				if err := m.ack(); err != nil {
					return fmt.Errorf("dlq: acking %s in %s after its replay: %w", m.name(), diag.Printable(cfg.queue, 255), err)
				}
			}
			res.Replayed += len(ms)
			res.ByTarget[target] += len(ms)
		}
		batch = batch[:0]
		return nil
	}
	err := scanSelected(ctx, conn, cfg.queue, cfg.Filter, cfg.Limit, &res, func(m *Message) error {
		batch = append(batch, m)
		if len(batch) >= cfg.Batch {
			return flush()
		}
		return nil
	}, flush)
	return res, err
}

// queueExists reports whether queue exists, on a channel of its own (a
// passive declare of a missing queue closes its channel).
func queueExists(conn *amqp.Connection, queue string) error {
	if _, err := amqpcall.Inspect(context.Background(), conn, callTimeout, queue); err != nil {
		return fmt.Errorf("queue %q does not exist or cannot be reached: %w", diag.Printable(queue, 255), err)
	}
	return nil
}

// replayCopy is m as it is replayed to target: the original payload and
// event metadata, without the failure history, with the replay provenance,
// signed for target — the consumer's queue whose stages believe its run and
// item (and only that queue's).
func replayCopy(m *Message, cfg ReplayConfig, target string) *message.Message {
	c := message.NewMessage(watermill.NewUUID(), m.Msg.Payload)
	for k, v := range m.Msg.Metadata {
		switch {
		case strings.HasPrefix(k, metakeys.PoisonPrefix), // sluice_poisoned_at too
			k == sluice.AttemptKey, k == sluice.FirstFailedAtKey, k == sluice.LastErrorKey,
			k == sluice.RetryTierKey, k == sluice.PreviousTraceparentKey:
			continue
		}
		c.Metadata[k] = v
	}
	count, _ := strconv.Atoi(m.Msg.Metadata.Get(metakeys.ReplayCount))
	c.Metadata[metakeys.ReplayCount] = strconv.Itoa(count + 1)
	c.Metadata[metakeys.ReplayedBy] = cfg.op.Operator
	c.Metadata[metakeys.ReplayedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	c.Metadata[metakeys.ReplayedFrom] = cfg.queue
	c.Metadata[metakeys.ReplayedClass] = m.Class
	if cfg.Run != "" {
		c.Metadata[replay.RunKey] = cfg.Run
		c.Metadata[replay.ItemKey] = m.Item()
	} else {
		delete(c.Metadata, replay.RunKey)
		delete(c.Metadata, replay.ItemKey)
	}
	cfg.op.Signer.Sign(c, target) // without a key: no stale signature
	return c
}
