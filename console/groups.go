package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/metakeys"
)

type groupRow struct {
	// Title is the group's class and reason's shape (groupTitle).
	ID, Title, Class, Fingerprint, Consumer, Target, Sample string
	Count                                                   int
	First, Last                                             time.Time
	// Arrivals counts the group's messages by the hour they were poisoned
	// in, over the arrivalHours before the scan (oldest first).
	Arrivals [arrivalHours]int
}

// Example is the group's sample reason when it says more than its shape
// (ids, numbers): shown under the shape, not beside it a second time.
func (g *groupRow) Example() string {
	if g.Sample == g.Fingerprint {
		return ""
	}
	return g.Sample
}

// groupTitle names a failure group as a person reads it: its class and its
// reason's shape (the group's id is a hash of them and the handler).
func groupTitle(m *dlq.Message) string {
	shape := dlq.Fingerprint(diag.Bound(m.Reason, 1024))
	if !strings.HasPrefix(shape, m.Class+": ") { // the poison stage's reasons begin with their class
		shape = m.Class + ": " + shape
	}
	return diag.Printable(shape, textMax)
}

// arrivalHours is the window of a group's arrival chart.
const arrivalHours = 24

// ArrivalChart draws a group's arrivals by hour as inline SVG bars (no
// script); each bar carries its count (data-n) and its hour's start.
func (g *groupRow) ArrivalChart(now time.Time) template.HTML {
	const w, h, bw = 96, 20, 4
	top := 1
	for _, n := range g.Arrivals {
		top = max(top, n)
	}
	var b strings.Builder
	start := now.Truncate(time.Hour).Add(-(arrivalHours - 1) * time.Hour)
	for i, n := range g.Arrivals {
		bh := 0
		if n > 0 {
			bh = max(1, n*(h-2)/top)
		}
		fmt.Fprintf(&b, `<rect class="bar" x="%d" y="%d" width="%d" height="%d" data-n="%d" data-hour="%s" fill="#dc2626"><title>%s: %d</title></rect>`,
			i*bw, h-bh, bw-1, bh, n, start.Add(time.Duration(i)*time.Hour).UTC().Format("15:04"), start.Add(time.Duration(i)*time.Hour).UTC().Format("Jan 2 15:04Z"), n)
	}
	// Every value in it is a number or a formatted time: nothing to escape.
	return template.HTML(fmt.Sprintf(`<svg class="arrivals" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="arrivals by hour, last %d hours"><rect x="0" y="0" width="%d" height="%d" fill="#fafafa" stroke="#ddd"/>%s</svg>`,
		w, h, w, h, arrivalHours, w, h, b.String()))
}

// scanGroups reads queue's failure groups; now places their arrivals.
func (c *Console) scanGroups(ctx context.Context, queue string, now time.Time) ([]*groupRow, int, int, error) {
	conn, err := c.conn()
	if err != nil {
		return nil, 0, 0, err
	}
	defer c.hangUp(conn)
	groups := map[string]*groupRow{}
	other := 0
	n, err := dlq.Open(conn, queue, dlq.Config{}).Each(ctx, dlq.Filter{}, 0, func(m *dlq.Message) error {
		id := m.Group()
		g, ok := groups[id]
		if !ok {
			if len(groups) >= groupsMax {
				other++
				return nil
			}
			g = &groupRow{ID: id, Title: groupTitle(m), Class: diag.Printable(m.Class, 64), Fingerprint: diag.Printable(dlq.Fingerprint(diag.Bound(m.Reason, 1024)), textMax),
				Consumer: diag.Printable(m.Consumer, textMax), Target: diag.Printable(m.Queue, 255), Sample: diag.Printable(m.Reason, textMax)}
			groups[id] = g
		}
		g.Count++
		if t := m.PoisonedAt; !t.IsZero() {
			if i := arrivalHours - 1 - int(now.Truncate(time.Hour).Sub(t.Truncate(time.Hour))/time.Hour); i >= 0 && i < arrivalHours {
				g.Arrivals[i]++
			}
			if g.First.IsZero() || t.Before(g.First) {
				g.First = t
			}
			if t.After(g.Last) {
				g.Last = t
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, 0, diag.RedactError(err)
	}
	out := slices.Collect(maps.Values(groups))
	slices.SortFunc(out, func(a, b *groupRow) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.ID, b.ID)) })
	return out, other, n, nil
}

func (c *Console) groups(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok {
		c.fail(w, r, http.StatusNotFound, errors.New("no such poison queue in the console's configuration"))
		return
	}
	show := func(s summary, busy bool) {
		c.render(w, r, "groups", map[string]any{"Queue": q, "Groups": s.groups, "Other": s.other, "Total": s.total,
			"ReadAt": s.at, "Busy": busy})
	}
	c.mu.Lock()
	last, haveLast := c.summaries[q.Poison]
	c.mu.Unlock()
	if haveLast && r.URL.Query().Get("fresh") == "" {
		if d, err := c.readyCount(r.Context(), q.Poison); err == nil {
			if s, ok := c.cached(q.Poison, d); ok {
				show(s, false)
				return
			}
		}
	}
	release, err := c.reading(r.Context(), q.Poison, c.cfg.CallTimeout)
	if err != nil {
		if errors.Is(err, ErrQueueBusy) && haveLast {
			show(last, true)
			return
		}
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	read := time.Now()
	gs, other, total, err := c.scanGroups(r.Context(), q.Poison, read)
	release()
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, err)
		return
	}
	s := summary{at: read, groups: gs, other: other, total: total}
	c.mu.Lock()
	c.summaries[q.Poison] = s
	c.mu.Unlock()
	show(s, false)
}

// readyCount is queue's ready count, exact (passiveDepth).
func (c *Console) readyCount(ctx context.Context, queue string) (int, error) {
	conn, err := c.conn()
	if err != nil {
		return 0, err
	}
	defer c.hangUp(conn)
	d, err := passiveDepth(ctx, conn, queue, c.cfg.CallTimeout)
	return d.Ready, err
}

type header struct{ Key, Value string }

type messageView struct {
	Position                                                     int
	EventID, EventType, Class, Reason, Consumer, Queue, Attempts string
	PoisonedAt                                                   time.Time
	TraceID, Stack, Payload, HeadersError, DeadLetter, MessageID string
	// Name and Identity name the dead letter as inspect and a run's page
	// do (dlq.Identity); DeadLetterID is its own id.
	Name, Identity, DeadLetterID string
	PayloadSize                  int
	Reads                        int // dlq.Message.Reads: reads, not retries
	// Summary is the reason, with the class when the reason does not
	// begin with it (the poison stage's do): the message's line, once.
	Summary    string
	Headers    []header
	HeadersCut int
}

// readsLabel says what dlq.Message.Reads is, beside the count and the
// broker's header it comes from.
const readsLabel = "reads of this copy in the poison queue (the broker's x-delivery-count: each console page and sluice dlq command that read it counts one; not retries — attempts are)"

// readNote says what a metadata key of a message read from a poison queue
// holds when it is about this read rather than the message's history — the
// broker's delivery count and redelivered flag, which each scan moves —
// and "" for any other key.
func readNote(key string) string {
	switch key {
	case metakeys.DeliveryCount:
		return readsLabel
	case metakeys.Redelivered:
		return "read before from the poison queue, by a console page or a sluice dlq command: not a retry"
	}
	return ""
}

func view(m *dlq.Message) messageView {
	md := m.Msg.Metadata
	v := messageView{Position: m.Position, EventID: diag.Printable(m.EventID, textMax), EventType: diag.Printable(m.EventType, textMax),
		Class: diag.Printable(m.Class, 64), Reason: diag.Printable(m.Reason, reasonMax), Consumer: diag.Printable(m.Consumer, textMax),
		Queue: diag.Printable(m.Queue, 255), Attempts: diag.Printable(m.Attempts, 32), PoisonedAt: m.PoisonedAt,
		TraceID: diag.Printable(m.TraceID, 64), Stack: diag.Printable(md.Get(metakeys.PoisonStack), stackMax),
		Payload: diag.Printable(string(m.Msg.Payload[:min(len(m.Msg.Payload), 4*payloadMax)]), payloadMax), PayloadSize: len(m.Msg.Payload),
		HeadersError: diag.Printable(m.HeadersError, textMax), Reads: m.Reads}
	id := m.Identity()
	v.MessageID, v.DeadLetterID, v.Identity = diag.Printable(id.MessageID, textMax), diag.Printable(id.DeadLetter, textMax), id.String()
	v.Name = cmp.Or(id.Name(), fmt.Sprintf("message at position %d", m.Position))
	v.Summary = v.Reason
	if !strings.HasPrefix(m.Reason, m.Class+": ") {
		v.Summary = v.Class + " · " + v.Reason
	}
	if m.DeadLetterReason != "" {
		v.DeadLetter = diag.Printable(m.DeadLetterReason+" in "+m.DeadLetterQueue+" ×"+m.DeadLetterCount, textMax)
	}
	keys := slices.Sorted(maps.Keys(md))
	for i, k := range keys {
		if i == headersMax {
			v.HeadersCut = len(keys) - headersMax
			break
		}
		h := header{Key: diag.Printable(k, 128), Value: diag.Printable(md[k], headerMax)}
		if note := readNote(k); note != "" { // the broker's count of this read, not of the message's tries
			h.Value += " — " + note
		}
		v.Headers = append(v.Headers, h)
	}
	return v
}

var errPageFull = errors.New("page full")

func (c *Console) group(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok {
		c.fail(w, r, http.StatusNotFound, errors.New("no such poison queue in the console's configuration"))
		return
	}
	id := r.PathValue("group")
	pageN, _ := strconv.Atoi(r.URL.Query().Get("page"))
	pageN = max(1, min(pageN, 1<<20))
	release, err := c.reading(r.Context(), q.Poison, c.cfg.CallTimeout)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	defer release()
	conn, err := c.conn()
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, err)
		return
	}
	defer c.hangUp(conn)
	skip := (pageN - 1) * pageSize
	var ms []messageView
	seen := 0
	more := false
	title := "group " + diag.Printable(id, textMax) // until a message of it is read
	_, err = dlq.Open(conn, q.Poison, dlq.Config{}).Each(r.Context(), dlq.Filter{Group: id}, 0, func(m *dlq.Message) error {
		seen++
		if seen == 1 {
			title = groupTitle(m)
		}
		if seen <= skip {
			return nil
		}
		if len(ms) == pageSize {
			more = true
			return errPageFull
		}
		ms = append(ms, view(m))
		return nil
	})
	if err != nil && !errors.Is(err, errPageFull) {
		c.fail(w, r, http.StatusBadGateway, diag.RedactError(err))
		return
	}
	c.render(w, r, "group", map[string]any{"Queue": q, "Group": id, "Title": title, "Messages": ms, "Page": pageN, "Prev": pageN - 1, "Next": pageN + 1,
		"More": more, "Actions": c.actions()})
}

// consumerQueues are the configured consumer queues: the only queues a
// replay may be redirected to.
func (c *Console) consumerQueues() []string {
	var qs []string
	for _, q := range c.cfg.Queues {
		qs = append(qs, q.Name)
	}
	return qs
}

// actions says which actions the console offers.
func (c *Console) actions() map[string]bool {
	return map[string]bool{
		"Replay":  !c.cfg.ReadOnly && c.cfg.Publisher != nil && c.cfg.Outcomes != nil,
		"Discard": !c.cfg.ReadOnly,
		"Archive": !c.cfg.ReadOnly && c.cfg.Archive != nil,
	}
}
