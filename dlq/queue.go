package dlq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/signing"
)

// Config is who acts on a poison queue and with what: the same for each
// operation of a Queue (and for Restore), given once.
type Config struct {
	// Operator names who acts: each replayed copy carries it
	// (sluice_replayed_by), each archive record (ArchivedBy) and a run's page.
	Operator string
	// Publisher is what Replay, ClosedLoop and Restore publish with; a
	// read, Archive and Discard need none.
	Publisher Publisher
	// Signer, when set (the consumers' key), signs each replayed copy's
	// control headers, the run and item among them, for the consumers'
	// stages that have the same key; a message whose own signature does not
	// verify (not a diagnosis the poison stage wrote: a producer's message
	// the broker dead-lettered, say) is replayed only with ReplayConfig.To,
	// never to the sluice_poison_queue it names. It signs each archive
	// record (ArchiveRecord.Signature) beside its digest, and Restore then
	// refuses a record without a signature of one of its keys: restore
	// with the same key proves the record was written by someone holding
	// it.
	Signer *signing.Signer
}

// Queue is one poison queue on a broker connection: what sluice dlq and the
// console read and act on. Every method reads the queue with basic.get and
// never acknowledges a message it leaves: when it ends it returns each one
// and waits until the queue counts them again, so the next reader finds them
// back in their order (on a quorum queue too; the broker returns them if
// the process dies). Each wait on the broker is bounded (10 s each,
// without progress on a connection rabbitmq.Dial opened: package doc).
//
// A Queue holds no state but its connection and name, and each call opens
// a channel of its own; but two reads of one queue at once would each see
// part of it and put their parts back interleaved — read a queue from one
// caller at a time (the console takes turns within itself).
type Queue struct {
	conn *amqp.Connection
	name string
	cfg  Config
}

// Open returns the poison queue name on conn, acted on as cfg says (a zero
// Config reads, archives and discards as "": Replay needs its Publisher).
// Nothing is read yet: the first call returns ErrNoQueue when the queue
// does not exist. The connection is the caller's to close.
func Open(conn *amqp.Connection, name string, cfg Config) *Queue {
	return &Queue{conn: conn, name: name, cfg: cfg}
}

// Each calls fn with each message f selects, at most limit (0: all), as it
// reads them: a caller that keeps nothing holds one message in memory at a
// time, whatever the queue's size. It returns how many it selected; every
// message stays in the queue. fn returning an error ends the read with it.
func (q *Queue) Each(ctx context.Context, f Filter, limit int, fn func(*Message) error) (int, error) {
	return each(ctx, q.conn, q.name, f, limit, fn)
}

// Inspect returns at most limit messages f selects (0: all), returning
// every message to the queue. Each reads as much in bounded memory.
func (q *Queue) Inspect(ctx context.Context, f Filter, limit int) ([]*Message, error) {
	return inspect(ctx, q.conn, q.name, f, limit)
}

// Stats reads the whole queue (returning every message) and groups what f
// selects, showing the top most frequent values of each group (20 when 0,
// at most 1000: Stats.Top says which). Its memory is bounded by
// Stats.Capacity values a group, whatever the queue holds.
func (q *Queue) Stats(ctx context.Context, f Filter, top int) (Stats, error) {
	return readStats(ctx, q.conn, q.name, f, top)
}

// Target is where a replay with cfg sends m: cfg.To, else the
// sluice_poison_queue m names when that can be believed, either one only if
// it is a queue the replay may publish to (cfg.Targets, or the poison
// queue's family); an error matching ErrUnreadable, ErrNoTarget or
// ErrTargetRefused says why there is none. Replay and its dry run choose
// every target here; a console's dry run asks it too. It reads nothing.
func (q *Queue) Target(cfg ReplayConfig, m *Message) (string, error) {
	cfg.queue, cfg.op = q.name, q.cfg
	return cfg.target(m)
}

// Replay republishes the selected messages to the queue they were consumed
// from (Target), with the attempt count reset and replay provenance
// (sluice_replayed_by, sluice_replayed_at, sluice_replayed_from,
// sluice_replayed_class, sluice_replay_count: docs/cli.md, "What a replayed
// message carries"), and acks each in the poison queue only after its
// publish was confirmed. Messages not selected stay where they are, in
// order. A publish that fails stops the run: the messages of the failed
// batch stay in the poison queue (those of it already published are then
// delivered twice; the inbox absorbs that). A dry run (cfg.DryRun) checks
// each target exists and changes nothing.
func (q *Queue) Replay(ctx context.Context, cfg ReplayConfig) (Result, error) {
	cfg.queue, cfg.op = q.name, q.cfg
	return replayOn(ctx, q.conn, cfg)
}

// ClosedLoop replays in batches — the canary, then the ramp, then the last
// size again until nothing selected is left — and after each batch waits
// for the consumers' outcomes in l.Store. The canary must come back all
// processed or duplicate; a ramp batch may be poisoned again at most
// l.MaxRepoison. A stop returns an error wrapping ErrStopped. cfg.Run must
// be set: a new, unique run id ("run-20260105T120000Z-3f2a9c1b", as the CLI
// and the console make them). The run itself is kept in l.Store beside its
// outcomes when the store keeps runs (ledger.Runs).
func (q *Queue) ClosedLoop(ctx context.Context, cfg ReplayConfig, l Loop) (Result, error) {
	cfg.queue, cfg.op = q.name, q.cfg
	return runClosedLoop(ctx, q.conn, cfg, l)
}

// Archive writes each selected message to cfg.Sink (a file synced to disk,
// or a table) before acking it in the queue; the others stay, in order. A
// crash between the write and the ack leaves the message in both: archive
// again to see it twice in the archive, never lost. Restore publishes the
// records back.
func (q *Queue) Archive(ctx context.Context, cfg ArchiveConfig) (Result, error) {
	cfg.queue, cfg.op = q.name, q.cfg
	return archive(ctx, q.conn, cfg)
}

// Discard removes the messages f selects for good, at most limit (0: all);
// with dryRun it only counts them. The caller records them (event ids and
// the reason) in the audit log first-hand: the items it returns name them
// (Message.Item).
func (q *Queue) Discard(ctx context.Context, f Filter, limit int, dryRun bool) (Result, []string, error) {
	return discard(ctx, q.conn, q.name, f, limit, dryRun)
}
