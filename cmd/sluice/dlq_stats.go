package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
)

// --top's default and most: dlq.Queue.Stats' own (20 when given 0, at most
// 1000: more is taken as 1000); the flag refuses what the queue's Stats
// would not show.
const (
	topDefault = 20
	topMax     = 1000
)

func newStats(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var asJSON bool
	var top int
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Count a poison queue's messages by class, error fingerprint and event type",
		Long: "Reads every message of the queue and returns all of them: they stay in the queue,\n" +
			"in order (marked redelivered; on a quorum queue each look counts one delivery, see inspect).\n" +
			"The error fingerprint is the reason with ids and numbers normalised.\n" +
			"Each group shows its --top most frequent values and counts the rest as (other), in memory\n" +
			"bounded whatever the queue holds.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if top < 1 || top > topMax {
				return usageError{fmt.Errorf("--top %d: want 1 to %d", top, topMax)}
			}
			f, conn, ctx, done, err := ff.open(g, false)
			if err != nil {
				return err
			}
			defer done()
			s, err := dlq.Open(conn, ff.queue, dlq.Config{}).Stats(ctx, f, top)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(out, s)
			}
			queue := diag.Printable(ff.queue, 255)
			if s.Skipped > 0 {
				fmt.Fprintf(out, "%s: %d of %d messages match the filter (%d skipped)", queue, s.Total, s.Scanned, s.Skipped)
			} else {
				fmt.Fprintf(out, "%s: %d messages", queue, s.Total)
			}
			if s.Items < s.Total { // copies of one delivery made twice (an uncertain publish)
				fmt.Fprintf(out, " (%d items: copies with one identity count once)", s.Items)
			}
			if !s.Oldest.IsZero() {
				fmt.Fprintf(out, ", poisoned from %s to %s", s.Oldest.Format(time.RFC3339), s.Newest.Format(time.RFC3339))
			}
			fmt.Fprintln(out)
			for _, grp := range []struct {
				title  string
				counts map[string]int
				other  int
			}{{"class", s.ByClass, s.Other.Class}, {"error fingerprint", s.ByFingerprint, s.Other.Fingerprint}, {"event type", s.ByEventType, s.Other.EventType}} {
				fmt.Fprintln(out)
				countTable(out, grp.title, grp.counts, grp.other)
			}
			if s.Unreadable > 0 {
				fmt.Fprintln(out)
				unreadableTable(out, s)
			}
			if len(s.Approximate) > 0 {
				fmt.Fprintf(out, "\nmore than %d different values of %s: their counts are lower bounds, the rest is in (other)\n",
					s.Capacity, strings.Join(s.Approximate, ", "))
			}
			return nil
		},
	}
	ff.register(cmd, "unused")
	_ = cmd.Flags().MarkHidden("limit")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&top, "top", topDefault, fmt.Sprintf("show the N most frequent values of each group, the rest as one (other) row (at most %d)", topMax))
	return cmd
}

// countTable prints a group's counts, the most frequent first, and other:
// the messages under no value shown.
func countTable(out io.Writer, title string, counts map[string]int, other int) {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if counts[keys[i]] != counts[keys[j]] {
			return counts[keys[i]] > counts[keys[j]]
		}
		return keys[i] < keys[j]
	})
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{title, "messages"})
	for _, k := range keys { // message contents: escaped and bounded
		t.AppendRow(table.Row{diag.Printable(k, cellMax), counts[k]})
	}
	if other > 0 {
		t.AppendRow(table.Row{"(other)", other})
	}
	t.Render()
}

// unreadableTable names the messages whose headers could not be read.
func unreadableTable(out io.Writer, s dlq.Stats) {
	fmt.Fprintf(out, "%d messages whose headers could not be parsed (remove them with `sluice dlq discard --unreadable`):\n", s.Unreadable)
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"position", "message id", "body bytes", "reason"})
	for _, u := range s.UnreadableFirst {
		t.AppendRow(table.Row{u.Position, orDash(diag.Printable(u.MessageID, 64)), u.BodyBytes, diag.Printable(u.Reason, cellMax)})
	}
	if n := s.Unreadable - len(s.UnreadableFirst); n > 0 {
		t.AppendRow(table.Row{"", fmt.Sprintf("(%d more)", n), "", ""})
	}
	t.Render()
}
