package main

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
)

func newInspect(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var asJSON bool
	var preview int
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show messages of a poison queue with their diagnosis and a payload preview",
		Long: "Takes each message without acknowledging it and returns all of them when it ends, one\n" +
			"basic.nack each in the order read (the broker returns them too if the tool is killed):\n" +
			"nothing is removed, the order is kept, and the messages are marked redelivered. On a quorum\n" +
			"queue the messages returned before wait at its head: a run that stops among them reads on\n" +
			"to the first one never returned, to keep the order, and each message read counts one\n" +
			"delivery in its x-delivery-count (RabbitMQ 3.x-4.2). The poison queue `sluice topology`\n" +
			"declares has a delivery limit no reading reaches.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			f, conn, ctx, done, err := ff.open(g, false)
			if err != nil {
				return err
			}
			defer done()
			// Streamed: one message in memory at a time, whatever the queue holds.
			shown := 0
			n, err := dlq.Open(conn, ff.queue, dlq.Config{}).Each(ctx, f, ff.limit, func(m *dlq.Message) error {
				if asJSON {
					// reads: the metadata's sluice_amqp_delivery_count is the
					// broker's count of reads by scans, not of retries.
					id := m.Identity()
					rec := map[string]any{"uuid": m.Msg.UUID, "position": m.Position, "metadata": m.Msg.Metadata, "attempts": m.Attempts, "reads": m.Reads,
						"name": inspectName(m), "event_id": id.EventID, "message_id": id.MessageID, "dead_letter": id.DeadLetter}
					if utf8.Valid(m.Msg.Payload) {
						rec["payload"] = string(m.Msg.Payload)
					} else { // bytes kept losslessly, and said so
						rec["payload_base64"] = base64.StdEncoding.EncodeToString(m.Msg.Payload)
					}
					return writeJSON(out, rec)
				}
				shown++
				inspectTable(out, shown, m, preview)
				return nil
			})
			if err != nil || asJSON {
				return err
			}
			fmt.Fprintf(out, "%d messages shown; all are back in %s\n", n, diag.Printable(ff.queue, 255))
			return nil
		},
	}
	ff.register(cmd, "show at most this many messages (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&preview, "preview", 200, "payload bytes shown")
	return cmd
}

// inspectTable prints one message's diagnosis and payload preview, escaped
// and bounded. A message is named by its event id, else by its message id
// (the AMQP property), else by its position in the queue.
func inspectTable(out io.Writer, i int, m *dlq.Message, preview int) {
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	title := fmt.Sprintf("%d. %s (%s)", i, diag.Printable(m.Class, 32), inspectName(m))
	if m.Class == "" {
		title = fmt.Sprintf("%d. (%s)", i, inspectName(m))
	}
	t.SetTitle(title)
	for _, row := range [][2]string{
		{"reason", diag.Printable(m.Reason, cellMax)}, {"event type", diag.Printable(m.EventType, cellMax)},
		{"event id", diag.Printable(m.EventID, cellMax)}, {"message id", diag.Printable(m.Delivery.MessageId, 64)},
		{"dead letter id", diag.Printable(m.Identity().DeadLetter, 64)},
		{"consumer", diag.Printable(m.Consumer, cellMax)}, {"queue", diag.Printable(cmp.Or(m.Queue, m.DeadLetterQueue), cellMax)},
		{"attempts", diag.Printable(m.Attempts, 32)}, {"poison-queue reads", reads(m)},
		{"poisoned at", formatTime(m.PoisonedAt)}, {"trace id", diag.Printable(m.TraceID, 64)},
		{"payload", diag.Printable(string(m.Msg.Payload), preview)},
	} {
		if row[0] == "payload" && m.HeadersError != "" { // nothing above was readable: name it
			t.AppendRow(table.Row{"headers", "not parsed: " + diag.Printable(m.HeadersError, cellMax)})
			t.AppendRow(table.Row{"position", m.Position})
			t.AppendRow(table.Row{"body bytes", len(m.Msg.Payload)})
		}
		t.AppendRow(table.Row{row[0], orDash(row[1])})
	}
	t.Render()
}

// readsLabel says what dlq.Message.Reads is, beside the count: the same
// words as the console's.
const readsLabel = "reads of this copy in the poison queue (the broker's x-delivery-count: each console page and sluice dlq command that read it counts one; not retries — attempts are)"

// reads is the poison-queue reads row: the broker's count of this copy's
// reads, labelled, or "" (shown "-") before any.
func reads(m *dlq.Message) string {
	if m.Reads == 0 {
		return ""
	}
	return fmt.Sprintf("%d: %s", m.Reads, readsLabel)
}

// inspectName names a message in inspect's title as every page names it
// (dlq.Identity: "event ID", else "dead letter ID", else "message id ID"),
// else "position N" (its place in the queue when read).
func inspectName(m *dlq.Message) string {
	if n := m.Identity().Name(); n != "" {
		return n
	}
	return fmt.Sprintf("position %d", m.Position)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Format(time.RFC3339)
}
