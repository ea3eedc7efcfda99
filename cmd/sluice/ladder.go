package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A queue family's ladder — its retry tiers — is read from the broker where
// it can be: the tier queues are named <queue>.retry.<delay>, so the
// management API's list of queues shows each family's ladder whatever it
// was declared with. AMQP alone cannot list queues; without
// --management-url the ladder is --tiers (the library's default unless
// given), and a family whose main queue exists with none of those tiers is
// said to have another ladder.

// ladderFlags are how a command was told of the ladder.
type ladderFlags struct {
	tiers     string // --tiers as given, or its default
	given     bool   // --tiers was given: it wins over the broker's names
	poison    string // --poison-queue
	jitter    float64
	jitterQs  int
	listed    map[string]mgmtQueue // the management API's queues; nil without --management-url
	defaulted []string             // the families whose ladder is --tiers' default, not read from the broker
}

// families returns the family of each queue: read from the management API's
// list where --tiers was not given and the broker has the family, else
// built from --tiers (and --poison-queue, --tier-jitter).
func (l *ladderFlags) families(queues []string) ([]family, error) {
	delays, err := parseTiers(l.tiers)
	if err != nil {
		return nil, err
	}
	byName := map[string]family{}
	if l.listed != nil && !l.given && l.poison == "" && l.jitter == 0 {
		for _, f := range discover(l.listed) {
			byName[f.name] = f
		}
	}
	var fams []family
	for _, q := range queues {
		if f, ok := byName[q]; ok {
			fams = append(fams, f)
			continue
		}
		topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: q, TierDelays: delays, PoisonQueue: l.poison,
			TierJitter: broker.Jitter{Fraction: l.jitter, Queues: l.jitterQs}})
		if err != nil {
			return nil, usageError{err}
		}
		f := family{name: q}
		for _, tq := range topo.Queues() { // a jittered tier's every queue
			role := string(tq.Role)
			if tq.Role == rabbitmq.RoleTier {
				role = "tier " + tq.Tier
			}
			f.queues = append(f.queues, member{tq.Name, role})
		}
		if !l.given {
			l.defaulted = append(l.defaulted, q)
		}
		fams = append(fams, f)
	}
	return fams, nil
}

// otherLadder reports, for a family whose ladder is --tiers' default, that
// its main queue exists and none of its default tiers does: it was declared
// with another ladder, which --tiers or --management-url would show.
func (l *ladderFlags) otherLadder(w io.Writer, rows []queueRow) {
	for _, name := range l.defaulted {
		mainThere, tiers, tiersThere := false, 0, 0
		for _, r := range rows {
			switch {
			case r.Family != name:
			case r.Role == "main":
				mainThere = !r.Missing
			case strings.HasPrefix(r.Role, "tier "):
				tiers++
				if !r.Missing {
					tiersThere++
				}
			}
		}
		if mainThere && tiers > 0 && tiersThere == 0 {
			fmt.Fprintf(w, "%s has none of the tiers of the ladder %s: it was declared with another one. Give --tiers as it was declared,\n"+
				"or --management-url to read it from the broker (its tier queues are named %s.retry.<delay>).\n",
				diag.Printable(name, 255), l.tiers, diag.Printable(name, 255))
		}
	}
}

// consoleQueues are the console's queue families: each queue's tiers read
// from the management API when it is given (and --tiers is not), else
// --tiers. A family whose main queue exists with none of --tiers' default
// tiers is said, on out, to have another ladder.
func consoleQueues(g *globals, lf *ladderFlags, queues []string, mgmtURL string, out io.Writer) ([]console.Queue, error) {
	if mgmtURL != "" && !lf.given {
		var err error
		if lf.listed, err = listQueues(mgmtURL, g.url()); err != nil {
			return nil, err
		}
	}
	fams, err := lf.families(queues)
	if err != nil {
		return nil, err
	}
	var qs []console.Queue
	for _, f := range fams {
		q := console.Queue{Name: f.name}
		for _, m := range f.queues {
			switch {
			case m.role == "poison":
				q.Poison = m.name
			case strings.HasPrefix(m.role, "tier "):
				q.Tiers = append(q.Tiers, m.name)
			}
		}
		qs = append(qs, q)
	}
	if len(lf.defaulted) > 0 {
		conn, err := connect(g)
		if err != nil {
			return nil, err
		}
		defer func() { _ = amqpcall.Close(context.Background(), conn, callTimeout) }()
		var rows []queueRow
		for _, f := range fams {
			for _, m := range f.queues {
				r, err := row(conn, f.name, m.name, m.role)
				if err != nil {
					return nil, err
				}
				rows = append(rows, r)
			}
		}
		lf.otherLadder(out, rows)
	}
	return qs, nil
}
