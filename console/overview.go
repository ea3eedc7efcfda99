package console

import (
	"html/template"
	"net/http"
	"time"

	"github.com/sluicemq/sluice/internal/diag"
)

type queueRow struct {
	Name, Role string
	Depth      Depth
	Err        string
}

type family struct {
	Queue        Queue
	Rows         []queueRow
	Chart        template.HTML
	ChartCaption string
	Poison       int
}

type outboxRow struct {
	Name             string
	Pending, Failing int64
	Oldest           time.Time
	Err              string
	Groups           []errGroup
	ReadOnly         bool
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	conn, err := c.conn()
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, err)
		return
	}
	defer c.hangUp(conn)
	var fams []family
	now := time.Now()
	for _, q := range c.cfg.Queues {
		f := family{Queue: q}
		add := func(name, role string) {
			d, err := c.depth(r.Context(), conn, name)
			row := queueRow{Name: diag.Printable(name, 255), Role: role, Depth: d}
			if err != nil {
				row.Err = diag.Summary(err, textMax)
			}
			f.Rows = append(f.Rows, row)
			if role == "poison" {
				f.Poison = d.Ready
			}
			if err == nil && (role == "main" || role == "poison") {
				c.recordDepth(name, now, d.Ready)
			}
		}
		add(q.Name, "main")
		for _, t := range q.Tiers {
			add(t, "tier")
		}
		if q.Poison != "" {
			add(q.Poison, "poison")
		}
		f.Chart, f.ChartCaption = c.chart(q)
		fams = append(fams, f)
	}
	c.render(w, r, "overview", map[string]any{"Families": fams, "Outbox": c.outboxRows(r.Context(), false), "Runs": c.recentRuns(r.Context())})
}
