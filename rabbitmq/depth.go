package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// depthIntervalDefault is how often a Broker reads the depth of its queues
// (BrokerConfig.DepthInterval).
const depthIntervalDefault = 15 * time.Second

// QueueDepth is what a Broker last read of one of its queues.
type QueueDepth struct {
	TopologyQueue
	// Ready is the messages ready for delivery (sluice.queue.messages.ready) and
	// Consumers the queue's consumers, as of At.
	Ready, Consumers int
	// At is when they were read; zero before the first read that worked.
	At time.Time
	// Err is the last read's error (the queue missing, the broker
	// unreachable, or a quorum queue's sudden 0 not shown until the next
	// read counts 0 too: RabbitMQ's count while the queue's leader does not
	// answer), nil when it worked: Ready, Consumers and At are then the
	// last read's that worked.
	Err error
}

// depthPoller reads the depth of a topology's queues every interval, on a
// connection of its own, and observes them as gauges.
type depthPoller struct {
	conn     Connection // defaults filled
	queues   []TopologyQueue
	interval time.Duration
	family   string
	vhost    string
	quorum   bool // the topology's queues are quorum queues

	mu     sync.Mutex
	depths []QueueDepth
	// doubted[i]: queue i's last read counted a quorum queue's 0 and 0 that
	// was not shown (poll); only the poll reads and writes it.
	doubted []bool

	current atomic.Pointer[amqp.Connection] // the poll's, closed by close
	life    context.Context                 // ended by close: a dial in progress is given up
	end     context.CancelFunc
	again   chan struct{} // wake: read the queues now
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	mmu     sync.Mutex
	reg     metric.Registration
	own     bool // Connection.MeterProvider was set: adopt does nothing
	adopted bool
}

// newDepthPoller starts reading the depth of topo's queues every interval
// with c (defaults filled) and observing them with c.MeterProvider, or the
// global provider until a provider is adopted.
func newDepthPoller(c Connection, topo *Topology, interval time.Duration) (*depthPoller, error) {
	vhost := "/"
	if u, err := amqp.ParseURI(c.URLs[0]); err == nil {
		vhost = u.Vhost
	}
	p := &depthPoller{conn: c, queues: topo.Queues(), interval: interval, family: topo.cfg.Queue, vhost: vhost, quorum: topo.cfg.Quorum,
		again: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), own: c.MeterProvider != nil}
	p.life, p.end = context.WithCancel(context.Background())
	p.depths = make([]QueueDepth, len(p.queues))
	p.doubted = make([]bool, len(p.queues))
	for i, q := range p.queues {
		p.depths[i].TopologyQueue = q
	}
	if err := p.register(c.MeterProvider); err != nil {
		return nil, err
	}
	go p.run()
	return p, nil
}

// register observes the gauges with mp's instruments (the global provider's
// when nil), and no longer with the previous provider's.
func (p *depthPoller) register(mp metric.MeterProvider) error {
	meter := telemetry.Meter(mp)
	ready, err := meter.Int64ObservableGauge(telemetry.MetricQueueReady, metric.WithUnit("{message}"),
		metric.WithDescription("Messages ready for delivery in a queue of the broker's topology, as last read (queue.declare-ok)."))
	if err != nil {
		return fmt.Errorf("rabbitmq: creating %s: %w", telemetry.MetricQueueReady, err)
	}
	consumers, err := meter.Int64ObservableGauge(telemetry.MetricQueueConsumers, metric.WithUnit("{consumer}"),
		metric.WithDescription("Consumers of a queue of the broker's topology, as last read (queue.declare-ok)."))
	if err != nil {
		return fmt.Errorf("rabbitmq: creating %s: %w", telemetry.MetricQueueConsumers, err)
	}
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, d := range p.Depths() {
			if d.At.IsZero() {
				continue
			}
			attrs := metric.WithAttributes(system, semconv.MessagingDestinationName(d.Name), telemetry.AttrQueueRole.String(string(d.Role)),
				telemetry.AttrQueueFamily.String(p.family), telemetry.AttrQueueVhost.String(p.vhost))
			o.ObserveInt64(ready, int64(d.Ready), attrs)
			o.ObserveInt64(consumers, int64(d.Consumers), attrs)
		}
		return nil
	}, ready, consumers)
	if err != nil {
		return fmt.Errorf("rabbitmq: observing the queues' depths: %w", err)
	}
	p.mmu.Lock()
	defer p.mmu.Unlock()
	if p.reg != nil {
		_ = p.reg.Unregister()
	}
	p.reg = reg
	return nil
}

// adopt observes the gauges with mp from now on, unless the broker has a
// provider of its own or adopted one before; a nil mp is ignored.
func (p *depthPoller) adopt(mp metric.MeterProvider) error {
	p.mmu.Lock()
	if mp == nil || p.own || p.adopted {
		p.mmu.Unlock()
		return nil
	}
	p.adopted = true
	p.mmu.Unlock()
	return p.register(mp)
}

// Depths returns a copy of what was last read.
func (p *depthPoller) Depths() []QueueDepth {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]QueueDepth(nil), p.depths...)
}

func (p *depthPoller) run() {
	defer close(p.done)
	var conn *amqp.Connection
	defer func() {
		if conn != nil {
			_ = closeConn(conn, p.conn.WriteTimeout)
		}
	}()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		conn = p.poll(conn)
		select {
		case <-p.stop:
			return
		case <-t.C:
		case <-p.again:
		}
	}
}

// poll reads every queue once, on conn (dialled when nil or closed), each
// call bounded by WriteTimeout (the connection is closed under a call that
// overruns it), and returns the connection to use next time (nil after a
// failure of the connection).
func (p *depthPoller) poll(conn *amqp.Connection) *amqp.Connection {
	if conn == nil || conn.IsClosed() {
		var err error
		if conn, _, err = p.conn.dialContext(p.life, "sluice depth "+p.family, 0); err != nil {
			if p.life.Err() == nil { // not given up by close
				p.failed(0, err)
			}
			return nil
		}
		p.current.Store(conn)
		select {
		case <-p.stop: // closed while dialling
			return conn
		default:
		}
	}
	var ch *amqp.Channel
	for i, q := range p.queues {
		var info amqp.Queue
		read := func() error {
			return closeWithin(conn, p.conn.WriteTimeout, func() error {
				var err error
				if ch == nil {
					if ch, err = conn.Channel(); err != nil {
						return fmt.Errorf("rabbitmq: opening a channel: %w", err)
					}
				}
				info, err = ch.QueueDeclarePassive(q.Name, true, false, false, false, nil)
				return err
			})
		}
		err := read()
		// A quorum queue counts 0 messages and 0 consumers when its leader
		// does not answer within 250 ms (RabbitMQ's rabbit_quorum_queue:stat/2):
		// after a read that counted some, such a read is tried again, up to
		// twice, quorumReread apart; one still 0 is shown only if the next
		// poll reads it too (a queue drained for real shows 0 a poll late).
		for try := 0; err == nil && p.doubtful(i, info) && try < 2; try++ {
			select {
			case <-p.stop:
				return conn
			case <-time.After(quorumReread):
			}
			err = read()
		}
		if err == nil && p.doubtful(i, info) {
			p.doubt(i)
			continue
		}
		p.doubted[i] = false
		if err != nil {
			if conn.IsClosed() {
				p.failed(i, err)
				return nil
			}
			p.failedOne(i, err)
			ch = nil // a failed declare closes the channel
			continue
		}
		p.mu.Lock()
		p.depths[i].Ready, p.depths[i].Consumers, p.depths[i].At, p.depths[i].Err = info.Messages, info.Consumers, time.Now(), nil
		p.mu.Unlock()
	}
	if ch != nil {
		_ = closeWithin(conn, p.conn.WriteTimeout, ch.Close)
	}
	return conn
}

// quorumReread is how long the poller waits before it reads again a quorum
// queue that counted 0 messages and 0 consumers after counting some.
const quorumReread = 250 * time.Millisecond

// doubtful reports whether info, read of queue i, may be a quorum queue's
// false 0: 0 messages and 0 consumers, after a read that counted some, and
// not after a read that was doubted already.
func (p *depthPoller) doubtful(i int, info amqp.Queue) bool {
	if !p.quorum || info.Messages != 0 || info.Consumers != 0 || p.doubted[i] {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.depths[i].Ready > 0 || p.depths[i].Consumers > 0
}

// doubt records that queue i's read was a 0 not shown: its last values are
// kept, with errCountDoubted.
func (p *depthPoller) doubt(i int) {
	p.doubted[i] = true
	err := fmt.Errorf("%w: %s", errCountDoubted, p.queues[i].Name)
	p.mu.Lock()
	p.depths[i].Err = err
	p.mu.Unlock()
	p.conn.Logger.Info("A quorum queue counted 0 three times after counting some; its depth keeps its last values until the next read", watermill.LogFields{"queue": p.queues[i].Name})
}

// errCountDoubted is Depths' error for a quorum queue's 0 not shown yet.
var errCountDoubted = errors.New("rabbitmq: the quorum queue counted 0 messages and 0 consumers three times after counting some — RabbitMQ's answer while the queue's leader does not answer within 250 ms; shown if the next read counts 0 too")

// failed records err for the queues from i on: the connection failed.
func (p *depthPoller) failed(from int, err error) {
	err = diag.RedactError(err)
	p.mu.Lock()
	for i := from; i < len(p.depths); i++ {
		p.depths[i].Err = err
	}
	p.mu.Unlock()
	p.conn.Logger.Error("Reading the queues' depths failed; the depth gauges keep their last values", err, watermill.LogFields{"queue": p.family})
}

// failedOne records err for queue i: its declare failed.
func (p *depthPoller) failedOne(i int, err error) {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		err = queueMissing(p.queues[i].Name, true, err)
	}
	err = diag.RedactError(err)
	p.mu.Lock()
	p.depths[i].Err = err
	p.mu.Unlock()
	p.conn.Logger.Error("Reading a queue's depth failed", err, watermill.LogFields{"queue": p.queues[i].Name})
}

// wake makes the poller read the queues now, between two intervals: a
// consumer of the broker started consuming. It does not wait.
func (p *depthPoller) wake() {
	select {
	case p.again <- struct{}{}:
	default: // a read is due already
	}
}

// close stops the poller, closing its connection under a read in flight,
// stops observing, and waits. Idempotent.
func (p *depthPoller) close() error {
	p.once.Do(func() {
		close(p.stop)
		p.end() // a dial in progress: given up, not waited for until DialTimeout
		if c := p.current.Load(); c != nil {
			_ = c.CloseDeadline(time.Now())
		}
	})
	<-p.done
	p.mmu.Lock()
	defer p.mmu.Unlock()
	if p.reg != nil {
		err := p.reg.Unregister()
		p.reg = nil
		return err
	}
	return nil
}
