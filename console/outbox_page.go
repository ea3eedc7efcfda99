package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/outbox"
)

type errGroup struct {
	Error string
	Count int
	IDs   []int64
}

func (c *Console) outboxRows(ctx context.Context, withGroups bool) []outboxRow {
	var rows []outboxRow
	for _, name := range slices.Sorted(maps.Keys(c.cfg.Outboxes)) {
		o := c.cfg.Outboxes[name]
		row := outboxRow{Name: diag.Printable(name, textMax), ReadOnly: c.cfg.ReadOnly}
		var st outbox.Stats
		err := c.storeCall(ctx, "counting the outbox's rows", func(ctx context.Context) (err error) { st, err = o.Stats(ctx); return err })
		if err != nil {
			row.Err = diag.Summary(err, textMax)
			rows = append(rows, row)
			continue
		}
		row.Pending, row.Failing, row.Oldest = st.Pending, st.Failing, st.Oldest
		if withGroups {
			var es []OutboxEntry
			err := c.storeCall(ctx, "listing the outbox's failing rows", func(ctx context.Context) (err error) { es, err = o.List(ctx, true, 500); return err })
			if err != nil {
				row.Err = diag.Summary(err, textMax)
			}
			by := map[string]*errGroup{}
			for _, e := range es {
				k := diag.Printable(dlq.Fingerprint(diag.Bound(e.LastError, 1024)), textMax)
				g, ok := by[k]
				if !ok {
					g = &errGroup{Error: k}
					by[k] = g
				}
				g.Count++
				if len(g.IDs) < 10 {
					g.IDs = append(g.IDs, e.ID)
				}
			}
			for _, g := range by {
				row.Groups = append(row.Groups, *g)
			}
			slices.SortFunc(row.Groups, func(a, b errGroup) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.Error, b.Error)) })
		}
		rows = append(rows, row)
	}
	return rows
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "outbox", c.outboxRows(r.Context(), true))
}

func (c *Console) outboxRetry(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	o, ok := c.cfg.Outboxes[name]
	if !ok {
		c.fail(w, r, http.StatusNotFound, errors.New("no such outbox"))
		return
	}
	if c.unaudited(w, r) {
		return
	}
	var n int64
	err := c.storeCall(r.Context(), "making the outbox's failing rows due", func(ctx context.Context) (err error) { n, err = o.RetryNow(ctx); return err })
	auditErr := c.audit(c.cfg.Operator(r), "console outbox retry", name, dlq.Filter{}, nil, dlq.Result{Replayed: int(n)}, err, "", nil)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, diag.RedactError(errors.Join(err, auditErr)))
		return
	}
	if auditErr != nil {
		c.fail(w, r, http.StatusInternalServerError, fmt.Errorf("%d rows made due: %w", n, auditErr))
		return
	}
	http.Redirect(w, r, c.cfg.Prefix+"/outbox", http.StatusSeeOther)
}
