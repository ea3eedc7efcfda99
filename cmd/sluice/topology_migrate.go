package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/rabbitmq"
)

// migrateConfirmTimeout bounds the wait for the broker's confirm of one
// moved message.
const migrateConfirmTimeout = 30 * time.Second

// binding is one binding of the old queue: an exchange, a routing key and,
// from the management API, the binding's arguments (a headers exchange's).
type binding struct {
	Exchange string     `json:"source"`
	Key      string     `json:"routing_key"`
	Args     amqp.Table `json:"arguments"`
	Kind     string     `json:"destination_type"`
}

func (b binding) String() string {
	s := fmt.Sprintf("exchange %s key %q", diag.Printable(b.Exchange, 255), diag.Printable(b.Key, 255))
	if len(b.Args) > 0 {
		s += fmt.Sprintf(" arguments %v", b.Args)
	}
	return s
}

// migration moves the consumer of an existing queue (from) onto a queue
// declared with Sluice's topology (topo.Config().Queue).
type migration struct {
	from     string
	topo     *rabbitmq.Topology
	bindings []binding
	source   string // where the bindings come from
}

// migrateFlags are the flags both steps share.
type migrateFlags struct {
	from     string
	bindings []string
	mgmtURL  string
	yes      bool
}

func (f *migrateFlags) resolve(g *globals, build func() (*rabbitmq.Topology, error)) (*migration, error) {
	topo, err := build()
	if err != nil {
		return nil, err
	}
	if len(topo.Partitions()) > 0 {
		return nil, usageError{errors.New("--partitions: migrate moves a queue onto one queue of Sluice's topology, not onto partitions (a message's partition depends on its key: publish the old queue's messages to the exchange instead)")}
	}
	if f.from == "" {
		return nil, usageError{errors.New("--from is required: the queue the consumer reads now")}
	}
	names := []string{topo.Config().Queue, topo.Config().PoisonQueue}
	for _, t := range topo.Tiers() {
		names = append(names, t.Topic)
	}
	for _, n := range names {
		if n == f.from {
			return nil, usageError{fmt.Errorf("--from %q is a queue of the new topology: a queue cannot change its type or arguments in place; migrate to a queue of another name (--queue)", diag.Bound(f.from, 64))}
		}
	}
	m := &migration{from: f.from, topo: topo}
	for _, s := range f.bindings {
		ex, key, ok := strings.Cut(s, "=")
		if !ok || ex == "" {
			return nil, usageError{fmt.Errorf("--binding %q: want EXCHANGE=ROUTING_KEY (the key may be empty: EXCHANGE=)", diag.Bound(s, 64))}
		}
		m.bindings = append(m.bindings, binding{Exchange: ex, Key: key})
	}
	m.source = "--binding"
	if f.mgmtURL != "" {
		listed, err := listBindings(f.mgmtURL, g.url(), f.from)
		if err != nil {
			return nil, err
		}
		m.bindings = append(m.bindings, listed...)
		m.source = "the management API"
		if len(f.bindings) > 0 {
			m.source = "--binding and the management API"
		}
	}
	if len(m.bindings) == 0 {
		return nil, usageError{fmt.Errorf("no binding of %s to copy: AMQP cannot list a queue's bindings, give each with --binding EXCHANGE=KEY, "+
			"or --management-url to read them; a queue the producers reach by its name on the default exchange has none: point them at %s instead",
			diag.Bound(f.from, 64), topo.Config().Queue)}
	}
	return m, nil
}

// listBindings reads queue's bindings from the management API, but the
// default exchange's (every queue has it, under its own name).
func listBindings(mgmtURL, amqpURL, queue string) ([]binding, error) {
	var listed []binding
	if err := mgmtGet(mgmtURL, amqpURL, func(vhost string) string {
		return "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(queue) + "/bindings"
	}, "the bindings of "+queue, &listed); err != nil {
		return nil, err
	}
	var out []binding
	for _, b := range listed {
		if b.Exchange != "" && b.Kind == "queue" {
			b.Kind = ""
			out = append(out, b)
		}
	}
	return out, nil
}

func newMigrate(g *globals, out io.Writer, build func() (*rabbitmq.Topology, error)) *cobra.Command {
	f := &migrateFlags{}
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move an existing queue's consumer onto a new queue with this topology (classic → quorum included), without losing a message",
		Long: "Two steps, each printing what it will do and doing it only with --yes:\n" +
			"  bind   declare --queue's topology and bind --queue to every binding of --from:\n" +
			"         from then on each message published lands in both queues;\n" +
			"         then switch the consumers to --queue (Sluice's stack, with its inbox);\n" +
			"  drain  with --from's consumers gone: unbind --from, move its messages to --queue\n" +
			"         (basic.get, publish confirmed, then ack), and with --delete-old delete it.\n" +
			"The messages published between the two steps are in both queues: the moved copies\n" +
			"are duplicates the inbox skips. AMQP cannot list bindings: give each with\n" +
			"--binding EXCHANGE=KEY, or --management-url to read them. See docs/rabbitmq.md.",
		Args: unknownSubcommand,
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.from, "from", "", "the existing queue the consumers read now (required)")
	pf.StringArrayVar(&f.bindings, "binding", nil, "a binding of --from to copy, EXCHANGE=ROUTING_KEY (repeatable; AMQP cannot list bindings)")
	pf.StringVar(&f.mgmtURL, "management-url", localenv.Get("SLUICE_MANAGEMENT_URL", ""), "RabbitMQ's management API, e.g. http://broker:15672, to read --from's bindings (env SLUICE_MANAGEMENT_URL)")
	pf.BoolVar(&f.yes, "yes", false, "do it (without: print what would be done, change nothing)")

	bind := &cobra.Command{
		Use:   "bind",
		Short: "Step 1: declare the new queues and bind the new queue beside the old one",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			m, conn, err := f.open(g, build, false)
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close() }()
			old, err := inspect(conn, m.from)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "step 1 of 2, bind: %s (%d ready, %d consumers) → %s\n", diag.Printable(m.from, 255), old.Messages, old.Consumers, m.topo.Config().Queue)
			m.planDeclare(out)
			if !f.yes {
				fmt.Fprintln(out, "dry run: nothing changed; run again with --yes")
				return nil
			}
			if err := m.declareAndBind(conn, out); err != nil {
				return err
			}
			fmt.Fprintf(out, "next: switch the consumers from %s to %s, then run `sluice topology migrate drain` with the same flags\n", diag.Printable(m.from, 255), m.topo.Config().Queue)
			return nil
		},
	}
	var limit int
	var deleteOld bool
	drain := &cobra.Command{
		Use:   "drain",
		Short: "Step 2, once no consumer reads the old queue: unbind it, move its messages to the new queue, delete it with --delete-old",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			if limit < 0 {
				return usageError{fmt.Errorf("--limit %d: want 0 (all) or more", limit)}
			}
			m, conn, err := f.open(g, build, true)
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close() }()
			old, err := inspect(conn, m.from)
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				fmt.Fprintf(out, "%s does not exist: nothing to drain\n", diag.Printable(m.from, 255))
				return nil
			}
			if err != nil {
				return err
			}
			if old.Consumers > 0 {
				return fmt.Errorf("%s still has %d consumers: switch them to %s first (what they take is not moved, and the moved copies would compete with them)",
					diag.Printable(m.from, 255), old.Consumers, m.topo.Config().Queue)
			}
			fmt.Fprintf(out, "step 2 of 2, drain: %s (%d ready, no consumer) → %s\n", diag.Printable(m.from, 255), old.Messages, m.topo.Config().Queue)
			m.planDeclare(out)
			for _, b := range m.bindings {
				fmt.Fprintf(out, "  unbind %s from %s\n", diag.Printable(m.from, 255), b)
			}
			bound := "all its messages"
			if limit > 0 {
				bound = fmt.Sprintf("at most %d messages", limit)
			}
			fmt.Fprintf(out, "  move %s from %s to %s: basic.get, publish confirmed, then ack (a rerun moves what is left)\n", bound, diag.Printable(m.from, 255), m.topo.Config().Queue)
			if deleteOld {
				fmt.Fprintf(out, "  delete %s once it is empty\n", diag.Printable(m.from, 255))
			} else {
				fmt.Fprintf(out, "  keep %s (empty and unbound; --delete-old deletes it)\n", diag.Printable(m.from, 255))
			}
			if !f.yes {
				fmt.Fprintln(out, "dry run: nothing changed; run again with --yes")
				return nil
			}
			moved, err := m.drain(conn, out, limit, deleteOld)
			rec := dlq.AuditRecord{Time: time.Now().UTC(), Operator: g.operator, Command: "topology migrate", Queue: m.from,
				Options: map[string]string{"to": m.topo.Config().Queue, "limit": fmt.Sprint(limit), "delete_old": fmt.Sprint(deleteOld)},
				Result:  dlq.Result{Scanned: moved, Selected: moved, Replayed: moved}, Outcome: "ok"}
			if err != nil {
				rec.Outcome, rec.Error = "error", diag.Redact(err.Error())
			}
			return errors.Join(err, dlq.AppendAudit(g.audit, rec))
		},
	}
	drain.Flags().IntVar(&limit, "limit", 0, "move at most this many messages (0: all; a rerun moves the rest)")
	drain.Flags().BoolVar(&deleteOld, "delete-old", false, "delete the old queue once it is empty and unused")
	cmd.AddCommand(bind, drain)
	return cmd
}

// open resolves the migration and connects; a step that moves messages
// (moves) checks first, with --yes, that it can record who did it.
func (f *migrateFlags) open(g *globals, build func() (*rabbitmq.Topology, error), moves bool) (*migration, *amqp.Connection, error) {
	m, err := f.resolve(g, build)
	if err != nil {
		return nil, nil, err
	}
	if moves && f.yes {
		if err := g.checkWrite(); err != nil {
			return nil, nil, err
		}
	}
	conn, err := connect(g)
	return m, conn, err
}

// inspect is a passive declare of queue on a channel of its own.
func inspect(conn *amqp.Connection, queue string) (amqp.Queue, error) {
	q, err := amqpcall.Inspect(context.Background(), conn, callTimeout, queue)
	if err != nil {
		return q, fmt.Errorf("queue %s: %w", diag.Printable(queue, 255), err)
	}
	return q, nil
}

// call runs f, a call on conn that waits for the broker, given up after
// callTimeout without an answer (amqpcall.Run: conn is closed).
func call(conn *amqp.Connection, what string, f func() error) error {
	return amqpcall.Run(context.Background(), conn, callTimeout, what, f)
}

// channel opens a channel on conn, and returns with it its close; each
// waits for the broker at most callTimeout (call).
func channel(conn *amqp.Connection) (*amqp.Channel, func(), error) {
	ch, err := amqpcall.Do(context.Background(), conn, callTimeout, "opening a channel", conn.Channel)
	if err != nil {
		return nil, nil, err
	}
	return ch, func() { _ = call(conn, "channel.close", ch.Close) }, nil
}

func (m *migration) planDeclare(out io.Writer) {
	for _, q := range m.topo.Plan().Queues {
		fmt.Fprintf(out, "  declare %s %s\n", q.Name, q.Arguments)
	}
	for _, b := range m.bindings {
		fmt.Fprintf(out, "  bind %s to %s (from %s)\n", m.topo.Config().Queue, b, m.source)
	}
}

// declareAndBind declares the topology and binds the new queue to the old
// queue's bindings; both are idempotent.
func (m *migration) declareAndBind(conn *amqp.Connection, out io.Writer) error {
	todo, err := m.topo.Declare(context.Background(), conn)
	if err != nil {
		return err
	}
	for _, l := range todo {
		fmt.Fprintf(out, "to do: %s\n", l)
	}
	ch, closeChannel, err := channel(conn)
	if err != nil {
		return err
	}
	defer closeChannel()
	for _, b := range m.bindings {
		if err := call(conn, "queue.bind", func() error { return ch.QueueBind(m.topo.Config().Queue, b.Key, b.Exchange, false, b.Args) }); err != nil {
			return fmt.Errorf("binding %s to %s: %w", m.topo.Config().Queue, b, err)
		}
		fmt.Fprintf(out, "bound %s to %s\n", m.topo.Config().Queue, b)
	}
	return nil
}

// drain binds the new queue again (a drain never leaves the old queue's
// producers with no queue), unbinds the old one, moves its messages and,
// with deleteOld, deletes it. It returns the number of messages moved.
func (m *migration) drain(conn *amqp.Connection, out io.Writer, limit int, deleteOld bool) (int, error) {
	if err := m.declareAndBind(conn, out); err != nil {
		return 0, err
	}
	ch, closeChannel, err := channel(conn)
	if err != nil {
		return 0, err
	}
	defer closeChannel()
	for _, b := range m.bindings {
		if err := call(conn, "queue.unbind", func() error { return ch.QueueUnbind(m.from, b.Key, b.Exchange, b.Args) }); err != nil {
			return 0, fmt.Errorf("unbinding %s from %s: %w", diag.Printable(m.from, 255), b, err)
		}
		fmt.Fprintf(out, "unbound %s from %s\n", diag.Printable(m.from, 255), b)
	}
	moved, err := shovel(conn, m.from, m.topo.Config().Queue, limit)
	fmt.Fprintf(out, "moved %d messages from %s to %s\n", moved, diag.Printable(m.from, 255), m.topo.Config().Queue)
	if err != nil {
		return moved, err
	}
	left, err := inspect(conn, m.from)
	if err != nil {
		return moved, err
	}
	if !deleteOld {
		fmt.Fprintf(out, "%s: %d messages left, kept\n", diag.Printable(m.from, 255), left.Messages)
		return moved, nil
	}
	if left.Messages > 0 || left.Consumers > 0 {
		return moved, fmt.Errorf("%s not deleted: %d messages left, %d consumers; run drain again", diag.Printable(m.from, 255), left.Messages, left.Consumers)
	}
	if err := call(conn, "queue.delete", func() error { _, err := ch.QueueDelete(m.from, true, true, false); return err }); err != nil {
		return moved, fmt.Errorf("deleting %s: %w", diag.Printable(m.from, 255), err)
	}
	fmt.Fprintf(out, "deleted %s\n", diag.Printable(m.from, 255))
	return moved, nil
}

// shovel moves up to limit messages (0: all) from one queue to another,
// one at a time: basic.get, publish to the default exchange with the
// target's name (mandatory, confirmed), then ack. A failure leaves the
// message in from (nacked back); a crash between the confirm and the ack
// leaves a copy in both, which a rerun moves again: a duplicate the inbox
// skips. The copy keeps the properties, headers and body, but user_id,
// which RabbitMQ refuses from any user but the publisher's.
func shovel(conn *amqp.Connection, from, to string, limit int) (int, error) {
	ch, closeChannel, err := channel(conn)
	if err != nil {
		return 0, err
	}
	defer closeChannel()
	if err := call(conn, "confirm.select", func() error { return ch.Confirm(false) }); err != nil {
		return 0, fmt.Errorf("confirm mode: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	moved := 0
	for limit == 0 || moved < limit {
		var d amqp.Delivery
		var ok bool
		err := call(conn, "basic.get", func() (err error) { d, ok, err = ch.Get(from, false); return err })
		if err != nil {
			return moved, fmt.Errorf("reading %s: %w", diag.Printable(from, 255), err)
		}
		if !ok {
			return moved, nil
		}
		if err := forward(ch, returns, d, to); err != nil {
			_ = d.Nack(false, true)
			return moved, fmt.Errorf("moving message %d from %s: %w (it stays in %s)", moved+1, diag.Printable(from, 255), err, diag.Printable(from, 255))
		}
		if err := d.Ack(false); err != nil {
			return moved, fmt.Errorf("acking a moved message in %s (its copy is in %s: a rerun moves it again, a duplicate the inbox skips): %w", diag.Printable(from, 255), to, err)
		}
		moved++
	}
	return moved, nil
}

// forward publishes d's copy to queue and waits for the broker's confirm.
func forward(ch *amqp.Channel, returns <-chan amqp.Return, d amqp.Delivery, queue string) error {
	ctx, cancel := context.WithTimeout(context.Background(), migrateConfirmTimeout)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	})
	if err != nil {
		return err
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("no confirm within %s: %w", migrateConfirmTimeout, err)
	}
	select { // a return comes before its confirm
	case r := <-returns:
		return fmt.Errorf("%s returned it: %s", queue, r.ReplyText)
	default:
	}
	if !acked {
		return fmt.Errorf("%s refused it (nack: full, with x-overflow=reject-publish?)", queue)
	}
	return nil
}
