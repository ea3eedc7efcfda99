package console

import (
	"context"
	"fmt"
	"html/template"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/amqpcall"
)

// sampleIntervalDefault is how often the console reads the depth of each
// family's main and poison queue for the overview's chart
// (Config.SampleInterval).
const sampleIntervalDefault = 10 * time.Second

type sample struct {
	At    time.Time
	Ready int
}

// depth reads queue's depth with Config.Depth, or a passive declare on
// conn, within ctx and CallTimeout.
func (c *Console) depth(ctx context.Context, conn *amqp.Connection, queue string) (Depth, error) {
	if c.cfg.Depth != nil {
		ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		defer cancel()
		return c.cfg.Depth(ctx, queue)
	}
	return passiveDepth(ctx, conn, queue, c.cfg.CallTimeout)
}

// passiveDepth is queue's ready count and consumers, exact, from a
// passive declare (the management API's are sampled). The broker's answer
// is waited for at most bound, and not past ctx's end: conn is closed then
// (amqpcall.Do), and the error names the wait.
func passiveDepth(ctx context.Context, conn *amqp.Connection, queue string, bound time.Duration) (Depth, error) {
	q, err := amqpcall.Inspect(ctx, conn, bound, queue)
	if err != nil {
		return Depth{}, err
	}
	return Depth{Ready: q.Messages, Consumers: q.Consumers}, nil
}

// recordDepth keeps queue's ready count read at at, the last samplesMax of them.
func (c *Console) recordDepth(queue string, at time.Time, ready int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples[queue] = append(c.samples[queue], sample{At: at, Ready: ready})
	if s := c.samples[queue]; len(s) > samplesMax {
		c.samples[queue] = s[len(s)-samplesMax:]
	}
}

// sampleLoop reads the depths every SampleInterval until Close: the chart
// draws this series, whatever pages are loaded.
func (c *Console) sampleLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.SampleInterval)
	defer t.Stop()
	for {
		c.sampleOnce()
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleOnce reads the depth of each family's main and poison queue once,
// within a SampleInterval; a queue it cannot read has no sample this time.
func (c *Console) sampleOnce() {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.SampleInterval)
	defer cancel()
	var conn *amqp.Connection
	if c.cfg.Depth == nil {
		var err error
		if conn, err = c.conn(); err != nil {
			return
		}
		// Closed within the sample's interval: a dial that outlasted it
		// leaves no wait for the broker's close-ok behind.
		defer func() { _ = amqpcall.Close(ctx, conn, c.cfg.CallTimeout) }()
	}
	for _, q := range c.cfg.Queues {
		for _, name := range []string{q.Name, q.Poison} {
			if name == "" || ctx.Err() != nil {
				continue
			}
			if d, err := c.depth(ctx, conn, name); err == nil {
				c.recordDepth(name, time.Now(), d.Ready)
			}
		}
	}
}

// chart draws the depth of a family's main and poison queue over the
// samples taken — every SampleInterval, and at each load of the overview —
// as inline SVG (no script), each point placed at its time.
func (c *Console) chart(q Queue) (template.HTML, string) {
	c.mu.Lock()
	main, pois := slices.Clone(c.samples[q.Name]), slices.Clone(c.samples[q.Poison])
	c.mu.Unlock()
	const w, h = 400, 80
	top := 1
	var first, last time.Time
	for _, s := range append(slices.Clone(main), pois...) {
		top = max(top, s.Ready)
		if first.IsZero() || s.At.Before(first) {
			first = s.At
		}
		if s.At.After(last) {
			last = s.At
		}
	}
	span := last.Sub(first)
	line := func(ss []sample, color string) string {
		if len(ss) == 0 {
			return ""
		}
		var b strings.Builder
		for _, s := range ss {
			x := w
			if span > 0 {
				x = int(int64(w) * int64(s.At.Sub(first)) / int64(span))
			}
			fmt.Fprintf(&b, "%d,%d ", x, h-s.Ready*(h-4)/top-2)
		}
		return fmt.Sprintf(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s" data-points="%d"/>`, color, strings.TrimSpace(b.String()), len(ss))
	}
	caption := fmt.Sprintf("Depth over the last %s: %d reads", span.Round(time.Second), len(main))
	if c.cfg.SampleInterval > 0 {
		caption += fmt.Sprintf(", one every %s while the console runs", c.cfg.SampleInterval)
	}
	// Every value in it is a number or a constant: nothing to escape.
	return template.HTML(fmt.Sprintf(`<svg class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="depth over time"><rect x="0" y="0" width="%d" height="%d" fill="#fafafa" stroke="#ddd"/>%s%s<text x="4" y="12" font-size="10" fill="#555">max %d</text></svg>`,
		w, h, w, h, w, h, line(main, "#2563eb"), line(pois, "#dc2626"), top)), caption
}
