package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Message is one message of a poison queue with its diagnosis.
type Message struct {
	Delivery   amqp.Delivery
	Msg        *message.Message
	Class      string
	Reason     string
	EventID    string
	EventType  string
	Queue      string // where it was consumed from: the replay target
	Consumer   string
	Attempts   string
	PoisonedAt time.Time // zero when the header is missing or invalid
	TraceID    string
	// DeadLetterReason, DeadLetterQueue and DeadLetterCount are RabbitMQ's
	// own diagnosis, from x-death, of a message the broker dead-lettered
	// (its latest death: "delivery_limit", the queue it died in, how often
	// it died): a quorum queue's delivery limit moves a message that kills
	// its consumer to the poison queue with no Sluice diagnosis. When the
	// message has none, Class is "broker:" followed by DeadLetterReason
	// ("broker:delivery_limit", as Filter.Classes selects it), and Reason
	// says what the broker did.
	DeadLetterReason, DeadLetterQueue, DeadLetterCount string

	scan *scanner // the scan that read it, told of its ack
	// Position is the message's place in the queue when the scan read it,
	// from 1: with its message id and size, how the tools name a message
	// that has no readable event id.
	Position int
	// HeadersError is why its headers could not be read, when the AMQP
	// client refused to parse them (sluice_amqp_headers_error): every field
	// read from a header is then empty, and Reason is this.
	HeadersError string
	// Reads is how often this copy was read from the poison queue before
	// this read: a quorum queue's x-delivery-count (sluice_amqp_delivery_count)
	// counts each delivery returned to it, and the poison queue's only
	// readers are scans — each console page and sluice dlq command that
	// read it. Reads, not retries: Attempts is the deliveries the handler
	// failed. 0 on a classic queue, which keeps no count.
	Reads int
}

func newMessage(d amqp.Delivery) (*Message, error) {
	m, err := rabbitmq.Marshaler{}.Unmarshal(d)
	if err != nil {
		return nil, err
	}
	md := m.Metadata
	at, _ := time.Parse(time.RFC3339Nano, md.Get(metakeys.PoisonedAt))
	he := md.Get(metakeys.HeadersError)
	msg := &Message{
		Delivery: d, Msg: m, HeadersError: he,
		Class: md.Get(metakeys.PoisonClass), Reason: cmp.Or(md.Get(metakeys.PoisonReason), he),
		EventID: md.Get(sluice.EventIDKey), EventType: md.Get(sluice.EventTypeKey),
		Queue: md.Get(metakeys.PoisonQueue), Consumer: md.Get(metakeys.PoisonConsumer),
		Attempts: md.Get(sluice.AttemptKey), PoisonedAt: at, TraceID: md.Get(metakeys.PoisonTraceID),
	}
	if n, err := strconv.Atoi(md.Get(metakeys.DeliveryCount)); err == nil && n > 0 {
		msg.Reads = n
	}
	brokerDiagnosis(msg, md)
	return msg, nil
}

// brokerClassPrefix starts the class of a message RabbitMQ dead-lettered
// that has no Sluice diagnosis: "broker:delivery_limit" (a quorum queue's
// delivery limit: a consumer that crashed on it, or returned it, each
// time), "broker:rejected", "broker:expired", "broker:maxlen".
const brokerClassPrefix = "broker:"

// brokerDiagnosis fills m's broker fields from x-death (its latest entry,
// which RabbitMQ itself puts first when it dead-letters a message; the
// x-first-death-* headers are set only when absent, so a producer's copy
// of them would stand) and, when Sluice's diagnosis is missing, its class
// and reason from them.
func brokerDiagnosis(m *Message, md message.Metadata) {
	m.DeadLetterReason, m.DeadLetterQueue = md.Get(metakeys.DeadLetterReason), md.Get(metakeys.DeadLetterQueue)
	m.DeadLetterCount = md.Get(metakeys.DeathCount)
	if m.DeadLetterReason == "" || m.Class != "" {
		return
	}
	m.Class = brokerClassPrefix + m.DeadLetterReason
	if m.Reason == "" {
		m.Reason = fmt.Sprintf("%s: dead-lettered by RabbitMQ from queue %s (x-death count %s), no Sluice diagnosis",
			m.DeadLetterReason, cmp.Or(m.DeadLetterQueue, "?"), cmp.Or(m.DeadLetterCount, "?"))
	}
}

// ErrNoQueue is returned for a queue that does not exist.
var ErrNoQueue = errors.New("dlq: queue does not exist")

// callTimeout (10 s) bounds each wait of a scan — and so of every Queue method —
// on the broker: a channel's
// opening and close, a passive declare, a basic.get, the put-back's
// declares. A broker that does not answer (black-holed: the connection up,
// nothing coming back) held the scan until the AMQP heartbeat gave the
// connection up; past callTimeout the connection is closed — the broker
// returns what the scan held, in no set order on a quorum queue — and the
// error names the wait (amqpcall.ErrNoAnswer). On a connection
// rabbitmq.Dial opened the bound is on the answer's progress: callTimeout
// without a frame but heartbeats, and amqpcall.LimitFactor × callTimeout
// (5 minutes) in all, so that a large message arrives over a slow link; on
// any other it is on the whole call, the transfer included (amqpcall). The
// scan's context is checked between two calls, never under one: closing
// the connection under a read would give the messages back out of their
// order.
const callTimeout = 10 * time.Second

// call runs f, a call on conn that waits for the broker, within
// callTimeout (amqpcall.Do); what names the AMQP method.
func call[T any](conn *amqp.Connection, what string, f func() (T, error)) (T, error) {
	return amqpcall.Do(context.Background(), conn, callTimeout, what, f)
}

// run is call for a method that returns only an error.
func run(conn *amqp.Connection, what string, f func() error) error {
	return amqpcall.Run(context.Background(), conn, callTimeout, what, f)
}

// declarePassive is a bounded passive declare of queue on ch.
func declarePassive(conn *amqp.Connection, ch *amqp.Channel, queue string) (amqp.Queue, error) {
	return call(conn, "queue.declare (passive) of "+diag.Printable(queue, 255), func() (amqp.Queue, error) {
		return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	})
}

// openChannel is a bounded channel.open on conn.
func openChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	return call(conn, "channel.open", conn.Channel)
}

// closeChannel is a bounded channel.close of ch.
func closeChannel(conn *amqp.Connection, ch *amqp.Channel) error {
	return run(conn, "channel.close", ch.Close)
}

// scanQueue reads the queue's messages, at most as many as it held when the scan
// began, and calls fn with each; fn acks the ones to remove (Message.ack).
// It never acks by itself: when scanQueue ends it returns every message fn left
// — a plain classic queue all at once by closing the channel, any other
// queue with a basic.nack (requeue) each, in the order read; never by a
// basic.reject — and waits until the queue counts them again, so the next
// reader of the queue finds them back in their order (the broker returns
// them too if the process dies). fn returning stop ends the scan early.
// done, when not nil, runs after the last message, while fn's messages can
// still be acked. It returns how many messages it read for fn.
//
// On a quorum queue the messages returned wait at the queue's head, ahead
// of the others, in the order they came back (RabbitMQ's rabbit_fifo keeps
// them in a "returns" queue it serves first, when the queue has a delivery
// limit — rabbitmq.Topology declares one on the poison queue). A scan that
// stopped among such returned messages reads on, without fn, to the first
// message that was never returned, so that putting them back keeps the
// order: reading the first two of four just returned, and putting back only
// those, would leave 3 4 1 2. Each read of a quorum queue's message counts
// one delivery in its x-delivery-count on RabbitMQ 3.x to 4.2 (4.3 counts a
// basic.nack as no failed delivery); a classic queue keeps no count and
// puts a returned message back in its place.
func scanQueue(ctx context.Context, conn *amqp.Connection, queue string, fn func(*Message) (stop bool, err error), done func() error) (int, error) {
	ch, err := openChannel(conn)
	if err != nil {
		return 0, fmt.Errorf("dlq: opening a channel: %w", err)
	}
	sc := &scanner{conn: conn, ch: ch, queue: queue, acked: map[uint64]bool{}}
	defer sc.putBack() // returns the unacked messages to the queue, in order
	q, err := declarePassive(conn, ch, queue)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0, fmt.Errorf("%w: %s", ErrNoQueue, diag.Printable(queue, 255))
		}
		return 0, fmt.Errorf("dlq: %s: %w", diag.Printable(queue, 255), err)
	}
	depth, err := sc.depth(q.Messages)
	if err != nil {
		return 0, fmt.Errorf("dlq: reading %s: %w", diag.Printable(queue, 255), err)
	}
	n, err := scan(ctx, sc, queue, depth, fn)
	if err == nil && done != nil {
		err = done()
	}
	left := depth - n
	if left > 0 && sc.quorum && rabbitMQ3(conn) && !limited(conn, queue) {
		sc.toEnd = true // a 3.x quorum queue with no limit of Sluice's: read to the end
	}
	sc.readThrough(left)
	return n, err
}

// limited reports whether queue is a quorum queue declared with
// poisonqueue.DeliveryLimit, as rabbitmq.Topology declares a quorum
// poison queue: a declaration with exactly those arguments succeeds only
// then (it changes nothing). A quorum queue without a delivery limit
// requeues a message returned by basic.nack at its tail, so that putting
// back a head read early moves it behind the rest, while a full read put
// back in order keeps the order; a policy may give the queue a limit too,
// which no AMQP method shows, so a failed check only costs a longer read.
func limited(conn *amqp.Connection, queue string) bool {
	return declaredWith(conn, queue, amqp.Table{"x-queue-type": amqp.QueueTypeQuorum, "x-delivery-limit": int64(poisonqueue.DeliveryLimit)})
}

// declaredWith reports whether queue is a durable queue declared with
// exactly args: a declaration with them succeeds only then, and changes
// nothing. It runs on a channel of its own, which a refusal closes.
func declaredWith(conn *amqp.Connection, queue string, args amqp.Table) bool {
	return run(conn, "queue.declare of "+diag.Printable(queue, 255), func() error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }() // a refused declaration closes it already
		_, err = ch.QueueDeclare(queue, true, false, false, false, args)
		return err
	}) == nil
}

// depth is how many messages a scan of queue reads, given the count its
// passive declare gave. A count of 0 may be false: RabbitMQ answers a
// passive declare of a quorum queue with 0 messages when the queue's leader
// does not answer within 250 ms, or is not the one the queue's record names
// — right after its node died (rabbit_quorum_queue:stat/2, RabbitMQ 3.10 to
// 4.x) — and a scan that believed it found an empty poison queue where it
// held messages. A basic.get's answer counts the messages left from the
// leader's own state (rabbit_fifo_client:dequeue: the get waits for the
// leader, up to the broker's timeout), so a scan that counts 0 reads one
// message, held for its first read, and takes the count from it.
func (s *scanner) depth(counted int) (int, error) {
	if counted > 0 {
		return counted, nil
	}
	d, ok, err := s.fetch()
	if err != nil || !ok {
		return 0, err // the queue's end: it was empty
	}
	s.unread = append(s.unread, d)
	return 1 + int(d.MessageCount), nil
}

func scan(ctx context.Context, sc *scanner, queue string, depth int, fn func(*Message) (bool, error)) (int, error) {
	n := 0
	for n < depth {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		d, ok, err := sc.get()
		if err != nil {
			return n, fmt.Errorf("dlq: reading %s: %w", diag.Printable(queue, 255), err)
		}
		if !ok {
			break
		}
		n++
		m, err := newMessage(d)
		if err != nil {
			return n, err
		}
		m.scan = sc
		m.Position = n
		stop, err := fn(m)
		if err != nil || stop {
			return n, err
		}
	}
	return n, nil
}

// Ack removes the message from the queue.
func (m *Message) ack() error {
	if err := m.Delivery.Ack(false); err != nil {
		return err
	}
	if m.scan != nil {
		m.scan.acked[m.Delivery.DeliveryTag] = true
		m.scan.settled()
	}
	return nil
}

// settled counts an ack, and after settleWindow of them since the scan's
// last basic.get reads the next message ahead (held for the scan's next
// read, or put back with the rest): a basic.get of a quorum queue is a
// command the queue applies after the acks before it, and its answer comes
// once they are applied. Without it a replay's batch of acks can leave the
// broker's quorum queue client with more commands unapplied than it sends
// (returnChunk), and the scan's basic.nacks that follow come back out of
// order: a replay in batches of 100 left 6 of the 200 it left out of order
// (cmd/sluice.TestAReplayInLargeBatchesLeavesTheRestInOrder). A read
// ahead that fails is not the ack's failure: the scan's next read, or its
// put back, meets the channel's.
func (s *scanner) settled() {
	if s.settling++; s.settling < settleWindow {
		return
	}
	if d, ok, err := s.fetch(); err == nil && ok {
		s.unread = append(s.unread, d)
	}
}

// settleWindow is how many acks a scan sends before a basic.get: with
// returnChunk, at most 16 of its commands wait unapplied, half of what
// RabbitMQ's quorum queue client keeps before it gathers them (32).
const settleWindow = 8

// scanner holds what a scan read: the delivery tags in the order read
// (a few bytes each, not the messages) and those acked.
type scanner struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string
	held  []uint64
	acked map[uint64]bool
	// returned: the last message read was one a quorum queue had returned
	// before (redelivered, with its delivery count header).
	returned bool
	// quorum: a message read carried a quorum queue's delivery count
	// (RabbitMQ 3.x gives every delivery of a quorum queue one).
	quorum bool
	// toEnd: read through to the end (a quorum queue that may have no
	// delivery limit).
	toEnd bool
	// unread: messages read ahead — to learn how many a queue that counted
	// 0 held (depth), or after acks (settled) — which the scan's next reads
	// return first.
	unread []amqp.Delivery
	// settling: acks sent since the last basic.get (settled).
	settling int
}

// rabbitMQ3 reports whether conn's broker is RabbitMQ 3.x.
func rabbitMQ3(conn *amqp.Connection) bool {
	v, _ := conn.Properties["version"].(string)
	return strings.HasPrefix(v, "3.")
}

// get returns the next message of the scan: one depth read first, else
// one read now (fetch).
func (s *scanner) get() (amqp.Delivery, bool, error) {
	if len(s.unread) > 0 {
		d := s.unread[0]
		s.unread = s.unread[1:]
		return d, true, nil
	}
	return s.fetch()
}

// fetch reads the queue's next message (basic.get), held to be put back.
func (s *scanner) fetch() (amqp.Delivery, bool, error) {
	type got struct {
		d  amqp.Delivery
		ok bool
	}
	g, err := call(s.conn, "basic.get from "+diag.Printable(s.queue, 255), func() (got, error) {
		d, ok, err := s.ch.Get(s.queue, false)
		return got{d, ok}, err
	})
	d, ok := g.d, g.ok
	if err == nil {
		s.settling = 0 // applied before the get's answer (settled)
	}
	if err == nil && ok {
		s.held = append(s.held, d.DeliveryTag)
		s.returned = quorumReturned(d)
		if _, ok := d.Headers["x-delivery-count"]; ok {
			s.quorum = true
		}
	}
	return d, ok, err
}

// quorumReturned reports whether d is a message a quorum queue had
// returned before: redelivered, and with the count a quorum queue adds
// (x-delivery-count on 3.x, x-acquired-count on 4.x), which a classic
// queue never sets — a classic queue puts a returned message back in its
// place, so there is nothing to read through.
func quorumReturned(d amqp.Delivery) bool {
	if !d.Redelivered {
		return false
	}
	_, dc := d.Headers["x-delivery-count"]
	_, ac := d.Headers["x-acquired-count"]
	return dc || ac
}

// readThrough reads on, at most left messages and without fn, while the
// last message read is one a quorum queue had returned before — they all
// wait ahead of the others, and putting back only the first of them would
// move those behind the rest (scanQueue) — or to the end with toEnd. It holds
// what it reads, to put back.
func (s *scanner) readThrough(left int) {
	for ; left > 0 && (s.toEnd || s.returned); left-- {
		if _, ok, err := s.get(); err != nil || !ok {
			return
		}
	}
}

// putBack returns each message read and not acked, waits until the queue
// counts them ready again, and closes the channel. A classic queue with
// no arguments — rabbitmq.Topology's classic poison queue — gets them back
// all at once, by the channel's close: the queue puts returned messages
// back in their places by sequence number, in one pass, where a
// basic.nack each costs the queue a pass each (`sluice-bench -suite
// putback`: a scan of 10,000 takes 11–17× as long with a nack each). Any
// other queue gets a basic.nack (requeue) each, in the order read: a quorum
// queue serves what it got back in the order it got it, and returns a
// closed channel's messages, or a nack of many, in no set order (RabbitMQ
// 3.x folds over a map). Either way the broker applies the return after
// it answered: without the wait the next reader — the next command run at
// once — can take the messages behind them first, or count the queue
// short.
func (s *scanner) putBack() {
	queue := s.queue
	defer func() { _ = closeChannel(s.conn, s.ch) }()
	held := 0
	for _, tag := range s.held {
		if !s.acked[tag] {
			held++
		}
	}
	if held == 0 {
		return
	}
	q, err := declarePassive(s.conn, s.ch, queue)
	if err != nil {
		return // the channel is gone: the broker returns them
	}
	want, wait := q.Messages+held, putBackTimeout+time.Duration(held)*putBackPerMessage
	if !s.quorum && plainClassic(s.conn, queue) {
		_ = closeChannel(s.conn, s.ch) // returns them all, in their places
		ch, err := openChannel(s.conn)
		if err != nil {
			return
		}
		defer func() { _ = closeChannel(s.conn, ch) }()
		waitReady(s.conn, ch, queue, want, wait)
		return
	}
	// A basic.nack each, returnChunk at a time, each chunk's wait ended by
	// the queue counting it back or by its share of what is left of the
	// bound: see returnChunk.
	deadline := time.Now().Add(wait)
	base, sent := q.Messages, 0
	for _, tag := range s.held {
		if s.acked[tag] {
			continue
		}
		if err := s.ch.Nack(tag, false, true); err != nil {
			return // the channel is gone: the broker returns the rest
		}
		if sent++; sent%returnChunk == 0 && sent < held {
			waits := (held-sent+returnChunk-1)/returnChunk + 1 // the chunks left and the last wait
			waitReady(s.conn, s.ch, queue, base+sent, time.Until(deadline)/time.Duration(waits))
		}
	}
	waitReady(s.conn, s.ch, queue, want, time.Until(deadline))
}

// returnChunk is how many basic.nacks a scan sends a quorum queue before it
// waits for the queue to count them back. The queue's client in the
// broker's channel (rabbit_fifo_client, RabbitMQ 3.10 to 4.x) keeps up to
// quorum_commands_soft_limit commands (32 by default) unapplied; past that
// it gathers returns in a map keyed by consumer — a basic.get is a consumer
// of its own — and sends them in the map's order: a scan of 500 messages
// put back that way left 430 of them out of order
// (cmd/sluice.TestAScanPutsALargeQuorumPoisonQueueBackInOrder). Eight at a
// time, waited for, stay under it; a queue that gives no count (a false 0)
// is waited for its share of the bound each time, which gives its leader
// the time to apply them.
const returnChunk = 8

// plainClassic reports whether queue is a classic queue declared with no
// arguments, as rabbitmq.Topology declares a classic poison queue: a
// declaration naming only the classic type succeeds only then (it changes
// nothing). Any other queue — quorum, or classic with arguments — refuses
// it, and is put back a message at a time, which is slower, not wrong.
func plainClassic(conn *amqp.Connection, queue string) bool {
	return declaredWith(conn, queue, amqp.Table{"x-queue-type": amqp.QueueTypeClassic})
}

// putBackTimeout and putBackPerMessage bound how long a scan waits, after
// it returned its messages, for the queue to count them: putBackTimeout
// plus putBackPerMessage for each (it goes on when a consumer takes some
// meanwhile; there should be none on a poison queue). Returned a
// basic.nack each, the broker puts them back one by one: RabbitMQ 3.10
// took 17–19 s for 10,000 on a loaded 2-core machine, past a fixed 10 s,
// after which the next reader met a queue still short of them.
const (
	putBackTimeout    = 10 * time.Second
	putBackPerMessage = 5 * time.Millisecond
)

// waitReady polls the queue's ready count until it is at least want, at
// most wait: every 2 ms at first, then less often (up to every 100 ms) — a
// long put-back is not polled thousands of times.
func waitReady(conn *amqp.Connection, ch *amqp.Channel, queue string, want int, wait time.Duration) {
	deadline := time.Now().Add(wait)
	pause := 2 * time.Millisecond
	for time.Now().Before(deadline) {
		q, err := declarePassive(conn, ch, queue)
		if err != nil || q.Messages >= want {
			return
		}
		time.Sleep(min(pause, time.Until(deadline)))
		pause = min(2*pause, 100*time.Millisecond)
	}
}
