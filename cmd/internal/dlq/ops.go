package dlq

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/time/rate"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/sqlname"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/replay"
)

// Replay provenance: the metadata keys a replayed message carries.
const (
	ReplayedByKey    = "sluice_replayed_by"
	ReplayedAtKey    = "sluice_replayed_at"
	ReplayedFromKey  = "sluice_replayed_from"
	ReplayCountKey   = "sluice_replay_count"
	ReplayedClassKey = "sluice_replayed_class"
)

// Inspect returns at most limit selected messages (0: all), returning every
// message to the queue.
func Inspect(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int) ([]*Message, error) {
	var out []*Message
	_, err := Each(ctx, conn, queue, f, limit, func(m *Message) error {
		out = append(out, m)
		return nil
	})
	return out, err
}

// Each calls fn with each selected message, at most limit (0: all), as it
// reads them: a caller that keeps nothing holds one message in memory at a
// time, whatever the queue's size. It returns how many it selected; every
// message stays in the queue.
func Each(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int, fn func(*Message) error) (int, error) {
	n := 0
	_, err := Scan(ctx, conn, queue, func(m *Message) (bool, error) {
		if !f.Match(m) {
			return false, nil
		}
		n++
		if err := fn(m); err != nil {
			return true, err
		}
		return limit > 0 && n >= limit, nil
	}, nil)
	return n, err
}

// scanSelected scans queue and calls fn with each message f selects, at most
// limit (0: all) of them, counting Scanned and Selected into res; done runs
// as in Scan.
func scanSelected(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int, res *ReplayResult, fn func(*Message) error, done func() error) error {
	n, err := Scan(ctx, conn, queue, func(m *Message) (bool, error) {
		if limit > 0 && res.Selected >= limit {
			return true, nil
		}
		if !f.Match(m) {
			return false, nil
		}
		res.Selected++
		return false, fn(m)
	}, done)
	res.Scanned = n
	return err
}

// Publisher is what replay publishes with: it must return nil only for
// messages the broker stored and routed (rabbitmq.Publisher).
type Publisher interface {
	Publish(topic string, msgs ...*message.Message) error
}

// ReplayConfig configures Replay.
type ReplayConfig struct {
	Queue     string // the poison queue
	Filter    Filter
	Limit     int     // at most this many messages replayed (0: no limit)
	Rate      float64 // messages per second (0: no limit)
	Batch     int     // messages published, confirmed and acked together; default 10
	DryRun    bool    // select and count, change nothing
	To        string  // replay every message to this queue instead of its sluice_poison_queue
	Operator  string
	Publisher Publisher
	// Progress is called after each batch with the counts so far.
	Progress func(done int)
	// Run, when set, is the replay run: each copy carries replay.RunKey and
	// replay.ItemKey (Message.Item). Published is called with each group
	// once its publish is confirmed, before the originals are acked: an
	// item is recorded only if it was sent (and if the process dies before
	// the record, the consumer's own record of its outcome creates it). Its
	// context is not cancelled by an interrupt (afterConfirm).
	Run       string
	Published func(context.Context, []*Message) error
	// Signer, when set (--signing-key-file), signs each copy's control
	// headers, the run and item among them, for the consumers' stages that
	// have the same key; and a message whose own signature does not verify
	// (not a diagnosis the poison stage wrote: a producer's message the
	// broker dead-lettered, say) is replayed only with To, never to the
	// sluice_poison_queue it names.
	Signer *sluice.Signer
}

// ErrUnreadable is returned for a selected message whose headers the AMQP
// client could not parse: a replay would drop them.
var ErrUnreadable = errors.New("dlq: message's headers could not be read, so it is not replayed (a replay would drop them): inspect it, then archive or discard it (--unreadable)")

// target is where m is replayed: To, else its sluice_poison_queue when that
// can be believed; an error matching ErrNoTarget or ErrUnreadable says why
// there is none.
func (cfg ReplayConfig) target(m *Message) (string, error) {
	why := ""
	switch {
	case m.HeadersError != "":
		return "", fmt.Errorf("%w: %s: %s", ErrUnreadable, m.name(), diag.Printable(m.HeadersError, 200))
	case cfg.To != "":
		return cfg.To, nil
	case m.Queue == "":
		why = "no sluice_poison_queue"
	case cfg.Signer != nil && cfg.Signer.Verify(m.Msg) != nil:
		why = "its diagnosis is not signed with the key (--signing-key-file): its sluice_poison_queue is not believed"
	default:
		return m.Queue, nil
	}
	return "", fmt.Errorf("%w: %s: %s", ErrNoTarget, m.name(), why)
}

// afterConfirmTimeout bounds what follows a confirmed publish.
const afterConfirmTimeout = 10 * time.Second

// afterConfirm is the context of what follows a confirmed publish — the
// record of what was sent, a restored row's mark: an interrupt (Ctrl-C)
// cancels ctx, and work left undone then would leave a message both
// published and where it came from. It is bounded instead.
func afterConfirm(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), afterConfirmTimeout)
}

// ReplayResult counts what a replay did.
type ReplayResult struct {
	Scanned  int            `json:"scanned"`
	Selected int            `json:"selected"`
	Replayed int            `json:"replayed"`
	ByTarget map[string]int `json:"by_target"`
	// Plan is, for a dry run, each selected message and its target.
	Plan []Planned `json:"plan,omitempty"`
}

// Planned is one message a dry run would replay.
type Planned struct {
	Message string `json:"message"` // "event <id>", or "message <uuid>" without an event id
	Target  string `json:"target"`
}

// name is how errors and plans name m: its event id, else its UUID.
func (m *Message) name() string {
	if m.HeadersError != "" && m.Delivery.MessageId == "" {
		return fmt.Sprintf("unreadable message at position %d (%d bytes)", m.Position, len(m.Msg.Payload))
	}
	if m.EventID != "" {
		return "event " + diag.Printable(m.EventID, 128)
	}
	return "message " + diag.Printable(m.Msg.UUID, 64)
}

// ErrNoTarget is returned for a selected message that has no sluice_poison_queue.
var ErrNoTarget = errors.New("dlq: message has no sluice_poison_queue to replay to (use --to)")

// Replay republishes the selected messages to the queue they were consumed
// from, with the attempt count reset and replay provenance
// (ReplayedByKey, ...), and acks each in the poison queue only after its
// publish was confirmed. Messages not selected stay where they are, in order.
// A publish that fails stops the run: the messages of the failed batch stay
// in the poison queue (those of it already published are then delivered
// twice; the inbox absorbs that).
func Replay(ctx context.Context, conn *amqp.Connection, cfg ReplayConfig) (ReplayResult, error) {
	res := ReplayResult{ByTarget: map[string]int{}}
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
				copies[i] = replayCopy(m, cfg)
			}

			if limiter != nil {
				for range ms {
					if err := limiter.Wait(ctx); err != nil {
						return err
					}
				}
			}
			if err := cfg.Publisher.Publish(target, copies...); err != nil {
				return fmt.Errorf("dlq: replaying to %s: %w", diag.Printable(target, 255), err)
			}
			if cfg.Published != nil {
				actx, cancel := afterConfirm(ctx)
				err := cfg.Published(actx, ms)
				cancel()
				if err != nil {
					return fmt.Errorf("dlq: recording the replayed items (published, still in %s): %w", diag.Printable(cfg.Queue, 255), err)
				}
			}
			for _, m := range ms {
				if err := m.Ack(); err != nil {
					return fmt.Errorf("dlq: acking %s in %s after its replay: %w", m.name(), diag.Printable(cfg.Queue, 255), err)
				}
			}
			res.Replayed += len(ms)
			res.ByTarget[target] += len(ms)
		}
		batch = batch[:0]
		if cfg.Progress != nil {
			cfg.Progress(res.Replayed)
		}
		return nil
	}
	err := scanSelected(ctx, conn, cfg.Queue, cfg.Filter, cfg.Limit, &res, func(m *Message) error {
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
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("queue %q does not exist or cannot be reached: %w", diag.Printable(queue, 255), err)
	}
	return nil
}

// replayCopy is m as it is replayed: the original payload and event
// metadata, without the failure history, with the replay provenance.
func replayCopy(m *Message, cfg ReplayConfig) *message.Message {
	c := message.NewMessage(watermill.NewUUID(), m.Msg.Payload)
	for k, v := range m.Msg.Metadata {
		switch {
		case strings.HasPrefix(k, "sluice_poison"), k == poison.PoisonedAtKey,
			k == sluice.AttemptKey, k == sluice.FirstFailedAtKey, k == sluice.LastErrorKey,
			k == sluice.RetryTierKey, k == sluice.PreviousTraceparentKey:
			continue
		}
		c.Metadata[k] = v
	}
	count, _ := strconv.Atoi(m.Msg.Metadata.Get(ReplayCountKey))
	c.Metadata[ReplayCountKey] = strconv.Itoa(count + 1)
	c.Metadata[ReplayedByKey] = cfg.Operator
	c.Metadata[ReplayedAtKey] = time.Now().UTC().Format(time.RFC3339Nano)
	c.Metadata[ReplayedFromKey] = cfg.Queue
	c.Metadata[ReplayedClassKey] = m.Class
	if cfg.Run != "" {
		c.Metadata[replay.RunKey] = cfg.Run
		c.Metadata[replay.ItemKey] = m.Item()
	} else {
		delete(c.Metadata, replay.RunKey)
		delete(c.Metadata, replay.ItemKey)
	}
	cfg.Signer.Sign(c) // without a key: no stale signature
	return c
}

// Item is m's item in a replay run: its event id, else its message id, as
// replay.Item bounds it.
//
// A message whose headers could not be read and that has no message id
// has no stable name but its place: "unreadable message at position 3
// (120 bytes)".
func (m *Message) Item() string {
	if m.HeadersError != "" && m.Delivery.MessageId == "" {
		return replay.Item(m.name())
	}
	return replay.Item(cmp.Or(m.EventID, m.Msg.UUID))
}

// ArchiveConfig configures Archive.
type ArchiveConfig struct {
	Queue    string
	Filter   Filter
	Limit    int
	Sink     ArchiveSink // where the records go: a FileSink or a TableSink
	Operator string
	// Signer, when set, signs each record (ArchiveRecord.Signature) beside
	// its digest: restore with the same key proves the record was written
	// by someone holding it.
	Signer *sluice.Signer
	// Archived, when set, is called with each message once it is written
	// and acked.
	Archived func(*Message)
}

// ArchiveSink stores archive records durably: Archive acks a message only
// after Write returned nil.
type ArchiveSink interface {
	Write(ctx context.Context, rec ArchiveRecord) error
	// Name is the sink as counts and the audit log name it.
	Name() string
	Close() error
}

// FileSink appends records as JSON lines to a file, each synced to disk.
type FileSink struct {
	f *os.File
}

// OpenFileSink opens (creating) path for appending.
func OpenFileSink(path string) (*FileSink, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("dlq: opening the archive: %w", err)
	}
	return &FileSink{f: f}, nil
}

func (s *FileSink) Write(_ context.Context, rec ArchiveRecord) error {
	b, err := archiveJSON(rec)
	if err != nil {
		return fmt.Errorf("dlq: writing the archive: %w", err)
	}
	if _, err := s.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("dlq: writing the archive: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("dlq: syncing the archive: %w", err)
	}
	return nil
}

// Name is the file's path.
func (s *FileSink) Name() string { return s.f.Name() }

// Close closes the file.
func (s *FileSink) Close() error { return s.f.Close() }

// TableSink inserts records into a PostgreSQL table: the columns to find
// them by, and the whole record as the JSON an archive file holds. A
// TableSource reads the rows back and marks those it restored.
type TableSink struct {
	db     *sqlx.DB
	table  string
	insert string
}

// NewTableSink creates the table if it does not exist.
func NewTableSink(ctx context.Context, db *sqlx.DB, table string) (*TableSink, error) {
	quoted, _, err := sqlname.Quote(table, true)
	if err != nil {
		return nil, fmt.Errorf("dlq: archive %w", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+quoted+` (
	id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
	archived_at TIMESTAMP NOT NULL,
	archived_by TEXT NOT NULL,
	queue TEXT NOT NULL,
	uuid TEXT NOT NULL,
	event_id TEXT NOT NULL,
	class TEXT NOT NULL,
	record TEXT NOT NULL,
	restored_at TIMESTAMPTZ,
	restored_by TEXT)`); err != nil {
		return nil, fmt.Errorf("dlq: creating the archive table: %w", err)
	}
	return &TableSink{db: db, table: table, insert: db.Rebind(`INSERT INTO ` + quoted +
		` (archived_at, archived_by, queue, uuid, event_id, class, record) VALUES (?, ?, ?, ?, ?, ?, ?)`)}, nil
}

func (s *TableSink) Write(ctx context.Context, rec ArchiveRecord) error {
	b, err := archiveJSON(rec)
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, s.insert, rec.ArchivedAt, rec.ArchivedBy, rec.Queue, rec.UUID, rec.EventID, rec.Class, string(b)); err != nil {
		return fmt.Errorf("dlq: writing the archive table: %w", err)
	}
	return nil
}

// Name is "table T".
func (s *TableSink) Name() string { return "table " + s.table }

// Close does nothing: the database is the caller's.
func (s *TableSink) Close() error { return nil }

// archiveJSON is rec as an archive holds it: JSON whose C1 and bidirectional
// controls are escaped too (diag.EscapeJSON), so that printing an archive
// (cat, psql) runs nothing; it decodes to the same record.
func archiveJSON(rec ArchiveRecord) ([]byte, error) {
	b, err := json.Marshal(rec)
	return diag.EscapeJSON(b), err
}

// name is how plans name rec: its event id, else its UUID.
func (rec ArchiveRecord) name() string {
	if rec.EventID != "" {
		return "event " + diag.Printable(rec.EventID, 128)
	}
	return "message " + diag.Printable(rec.UUID, 64)
}

// ArchiveRecord is one line of an archive file: the message, where it was
// archived from (Queue, the poison queue: where restore publishes it back),
// and its digest and signature.
type ArchiveRecord struct {
	ArchivedAt    time.Time         `json:"archived_at"`
	ArchivedBy    string            `json:"archived_by"`
	Queue         string            `json:"queue"`
	UUID          string            `json:"uuid"`
	Class         string            `json:"class"`
	Reason        string            `json:"reason"`
	EventID       string            `json:"event_id"`
	EventType     string            `json:"event_type"`
	Metadata      map[string]string `json:"metadata"`
	Payload       string            `json:"payload,omitempty"`
	PayloadBase64 string            `json:"payload_base64,omitempty"`
	// Digest is "sha256:" and the hex SHA-256 of the other fields
	// (canonical): a record damaged, cut short or edited without
	// recomputing it is refused. It proves nothing against someone who
	// recomputes it: that is the Signature's part.
	Digest string `json:"digest,omitempty"`
	// Signature is the HMAC-SHA256 of the same fields under the signing
	// key (sluice.Signer, as the stages' copies carry it), when archive was
	// given one.
	Signature string `json:"signature,omitempty"`
}

// Archive writes each selected message to the sink (a file synced to disk,
// or a table) before acking it in the queue; the others stay, in order. A
// crash between the write and the ack leaves the message in both: archive
// again to see it twice in the archive, never lost.
func Archive(ctx context.Context, conn *amqp.Connection, cfg ArchiveConfig) (ReplayResult, error) {
	res := ReplayResult{ByTarget: map[string]int{}}
	err := scanSelected(ctx, conn, cfg.Queue, cfg.Filter, cfg.Limit, &res, func(m *Message) error {
		rec := ArchiveRecord{
			ArchivedAt: time.Now().UTC(), ArchivedBy: cfg.Operator, Queue: cfg.Queue, UUID: m.Msg.UUID,
			Class: m.Class, Reason: m.Reason, EventID: m.EventID, EventType: m.EventType, Metadata: m.Msg.Metadata,
		}
		if utf8.Valid(m.Msg.Payload) {
			rec.Payload = string(m.Msg.Payload)
		} else {
			rec.PayloadBase64 = base64.StdEncoding.EncodeToString(m.Msg.Payload)
		}
		rec.seal(cfg.Signer)
		if err := cfg.Sink.Write(ctx, rec); err != nil {
			return err
		}
		if err := m.Ack(); err != nil {
			return err
		}
		res.Replayed++
		res.ByTarget[cfg.Sink.Name()]++
		if cfg.Archived != nil {
			cfg.Archived(m)
		}
		return nil
	}, nil)
	return res, err
}

// AuditRecord is one line of the audit log: who ran what, on what, and how
// it ended.
type AuditRecord struct {
	Time     time.Time         `json:"time"`
	Operator string            `json:"operator"`
	Command  string            `json:"command"`
	Queue    string            `json:"queue"`
	Filters  map[string]string `json:"filters"`
	Options  map[string]string `json:"options,omitempty"`
	Result   ReplayResult      `json:"result"`
	Outcome  string            `json:"outcome"` // "ok", "dry-run" or "error"
	Error    string            `json:"error,omitempty"`
	// Reason is why the operator did it (discard requires one).
	Reason string `json:"reason,omitempty"`
	// Items are the messages a discard removed (event id, else message id).
	Items []string `json:"items,omitempty"`
}

// CheckAudit opens the audit log for appending (creating it) and closes it:
// a run that would move messages checks it can record them first.
func CheckAudit(path string) error {
	if path == "-" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("dlq: the audit log cannot be written, nothing was moved: %w", err)
	}
	return f.Close()
}

// AppendAudit appends rec as a JSON line to path (synced to disk), or
// writes it to stdout when path is "-".
func AppendAudit(path string, rec AuditRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	b = append(diag.EscapeJSON(b), '\n') // event ids and errors are message contents
	if path == "-" {
		_, err := os.Stdout.Write(b)
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("dlq: opening the audit log: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// Discard removes the selected messages for good; the caller records them
// (event ids and the reason) in the audit log first-hand: Discarded lists
// them.
func Discard(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int, dryRun bool) (ReplayResult, []string, error) {
	res := ReplayResult{ByTarget: map[string]int{}}
	var discarded []string
	err := scanSelected(ctx, conn, queue, f, limit, &res, func(m *Message) error {
		if !dryRun {
			if err := m.Ack(); err != nil {
				return err
			}
			res.Replayed++
		}
		discarded = append(discarded, m.Item())
		return nil
	}, nil)
	return res, discarded, err
}
