package console

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// The bounds of what a page renders of a message.
const (
	textMax    = 300       // a reason, a sample, a name in a table
	reasonMax  = 2048      // a reason in full
	stackMax   = 8 << 10   // a stack
	payloadMax = 2048      // a payload's preview
	headersMax = 64        // headers shown per message
	headerMax  = 512       // one header's value
	rowsMax    = 1000      // a run's rows kept for its outcome column
	runsMax    = 50        // runs kept in memory
	samplesMax = 120       // depth samples per queue, for the chart
	auditTail  = 256 << 10 // bytes of the audit log's tail read
	auditMax   = 200       // audit lines shown
)

func (c *Console) parse() error {
	c.tmpl = map[string]*template.Template{}
	funcs := template.FuncMap{
		"p":    func(s ...string) string { return c.cfg.Prefix + strings.Join(s, "") },
		"time": fmtTime,
		"rate": fmtRate,
		"age": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return time.Since(t).Round(time.Second).String()
		},
		"csrf":       func() string { return c.csrf },
		"name":       breakable,
		"readsLabel": func() string { return dlq.ReadsLabel },
		"pct":        func(f float64) string { return strconv.FormatFloat(100*f, 'f', 0, 64) + "%" },
	}
	pages, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		return err
	}
	for _, p := range pages {
		name := strings.TrimSuffix(strings.TrimPrefix(p, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", p)
		if err != nil {
			return err
		}
		c.tmpl[name] = t
	}
	return nil
}

// breakable is a name (a queue's) escaped, with a line-break opportunity
// after each dot, underscore and hyphen: a name too long for its cell
// wraps between its parts, never in the middle of one ("…_inventory.pois"
// / "on").
func breakable(name string) template.HTML {
	esc := template.HTMLEscapeString(name)
	var b strings.Builder
	for _, r := range esc {
		b.WriteRune(r)
		if r == '.' || r == '_' || r == '-' {
			b.WriteString("<wbr>")
		}
	}
	return template.HTML(b.String()) //nolint:gosec // escaped above; only <wbr> added
}

// fmtRate is a rate of messages a second, or a minute when below one a
// second.
func fmtRate(r float64) string {
	switch {
	case r <= 0 || math.IsNaN(r):
		return "0/s"
	case r < 1:
		return strconv.FormatFloat(r*60, 'f', 1, 64) + "/min"
	default:
		return strconv.FormatFloat(r, 'f', 1, 64) + "/s"
	}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.Handle("GET /static/", http.FileServerFS(assets))
	m.HandleFunc("/login", c.login)
	m.HandleFunc("GET /{$}", c.overview)
	m.HandleFunc("GET /q/{queue}/groups", c.groups)
	m.HandleFunc("GET /q/{queue}/g/{group}", c.group)
	m.HandleFunc("GET /q/{queue}/g/{group}/{action}", c.preview)
	m.HandleFunc("POST /q/{queue}/g/{group}/replay", c.replay)
	m.HandleFunc("POST /q/{queue}/g/{group}/discard", c.discard)
	m.HandleFunc("POST /q/{queue}/g/{group}/archive", c.archive)
	m.HandleFunc("GET /runs/{run}", c.runPage)
	m.HandleFunc("GET /outbox", c.outboxPage)
	m.HandleFunc("POST /outbox/{name}/retry", c.outboxRetry)
	m.HandleFunc("GET /audit", c.auditPage)
	c.mux = m
}

// page is what every template gets.
type page struct {
	Title    string
	ReadOnly bool
	Auth     bool
	Data     any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	var buf bytes.Buffer
	title := name
	if err := c.tmpl[name].Execute(&buf, page{Title: title, ReadOnly: c.cfg.ReadOnly, Auth: c.cfg.Token != "", Data: data}); err != nil {
		http.Error(w, "rendering the page: "+diag.Summary(err, textMax), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// fail renders an error page; the error is redacted and bounded.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	w.WriteHeader(code)
	c.render(w, r, "error", diag.Summary(err, reasonMax))
}

// poisonQueue returns the configured family whose poison queue is name: no
// other queue is read or acted on.
func (c *Console) poisonQueue(name string) (Queue, bool) {
	for _, q := range c.cfg.Queues {
		if q.Poison == name {
			return q, true
		}
	}
	return Queue{}, false
}

func (c *Console) conn() (*amqp.Connection, error) {
	conn, err := c.cfg.Dial()
	if err != nil {
		return nil, fmt.Errorf("connecting to the broker: %w", diag.RedactError(err))
	}
	return conn, nil
}

// storeCall runs f, one call to a store (an outbox, the outcome records),
// with ctx ended after CallTimeout; its error, when that bound ended it,
// names the call and the bound. A pool whose driver does not honour its
// context on a silent database (lib/pq's alone: its cancel request goes
// unanswered too) is not bounded by it: open PostgreSQL pools with
// sluicesql/postgres.Open.
func (c *Console) storeCall(ctx context.Context, what string, f func(context.Context) error) error {
	return bounded.Within(ctx, c.cfg.CallTimeout, what, f)
}

// hangUp closes conn, waiting for the broker's close-ok at most
// CallTimeout (a broker that does not answer holds no page past it), and
// not past the console's Close.
func (c *Console) hangUp(conn *amqp.Connection) {
	_ = amqpcall.Close(c.ctx, conn, c.cfg.CallTimeout)
}

// ---- overview

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

// ---- failure groups

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

// readNote says what a metadata key of a message read from a poison queue
// holds when it is about this read rather than the message's history — the
// broker's delivery count and redelivered flag, which each scan moves —
// and "" for any other key.
func readNote(key string) string {
	switch key {
	case rabbitmq.DeliveryCountKey:
		return dlq.ReadsLabel
	case rabbitmq.RedeliveredKey:
		return "read before from the poison queue, by a console page or a sluice dlq command: not a retry"
	}
	return ""
}

func view(m *dlq.Message) messageView {
	md := m.Msg.Metadata
	v := messageView{Position: m.Position, EventID: diag.Printable(m.EventID, textMax), EventType: diag.Printable(m.EventType, textMax),
		Class: diag.Printable(m.Class, 64), Reason: diag.Printable(m.Reason, reasonMax), Consumer: diag.Printable(m.Consumer, textMax),
		Queue: diag.Printable(m.Queue, 255), Attempts: diag.Printable(m.Attempts, 32), PoisonedAt: m.PoisonedAt,
		TraceID: diag.Printable(m.TraceID, 64), Stack: diag.Printable(md.Get(poison.StackKey), stackMax),
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

// ---- actions: preview, then a confirmed POST

type previewData struct {
	Queue     Queue
	Consumers []string // the queues a replay may be redirected to
	Group     string
	Title     string // the group's class and reason's shape (groupTitle)
	Action    string
	Count     int
	Targets   map[string]int
	Refused   int // messages the replay to their own queue would refuse
	Sample    []string
	Sample50  int
	Defaults  map[string]string
	Error     string
}

func (c *Console) preview(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	action := r.PathValue("action")
	if !ok || !c.actions()[strings.ToUpper(action[:1])+action[1:]] {
		c.fail(w, r, http.StatusNotFound, errors.New("no such action here (read-only, or not configured)"))
		return
	}
	d, err := c.dryRun(r.Context(), q, r.PathValue("group"), action)
	if errors.Is(err, ErrQueueBusy) {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, err)
		return
	}
	c.render(w, r, "preview", d)
}

// dryRun selects the group's messages and counts them by target, moving
// nothing: what a confirmation shows.
func (c *Console) dryRun(ctx context.Context, q Queue, group, action string) (previewData, error) {
	d := previewData{Queue: q, Group: group, Action: action, Targets: map[string]int{}, Consumers: c.consumerQueues(),
		Defaults: map[string]string{"canary": "1", "ramp": "5,20,100", "max_repoison": "10%", "wait": "30s"}}
	release, err := c.reading(ctx, q.Poison, c.cfg.CallTimeout)
	if err != nil {
		return d, err
	}
	defer release()
	conn, err := c.conn()
	if err != nil {
		return d, err
	}
	defer c.hangUp(conn)
	plan, pq := c.replayConfig(q, group, ""), dlq.Open(conn, q.Poison, dlq.Config{Signer: c.signer})
	d.Title = "group " + diag.Printable(group, textMax)
	titled := false
	n, err := pq.Each(ctx, dlq.Filter{Group: group}, 0, func(m *dlq.Message) error {
		if !titled {
			d.Title, titled = groupTitle(m), true
		}
		label, refused := targetLabel(pq, plan, m)
		if _, ok := d.Targets[label]; ok || len(d.Targets) < 20 {
			d.Targets[label]++
		}
		if refused {
			d.Refused++
		}
		if len(d.Sample) < 20 {
			d.Sample = append(d.Sample, cmp.Or(m.Identity().Name(), fmt.Sprintf("message at position %d", m.Position)))
		}
		return nil
	})
	d.Count = n
	return d, diag.RedactError(err)
}

func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok || !c.actions()["Replay"] {
		c.fail(w, r, http.StatusNotFound, errors.New("replay is not offered here"))
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, errors.New("confirm the replay: tick the box on the preview"))
		return
	}
	plan, err := loopForm(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if plan.to = strings.TrimSpace(r.PostFormValue("to")); plan.to != "" && !slices.Contains(c.consumerQueues(), plan.to) {
		c.fail(w, r, http.StatusBadRequest, errors.New("replay to: not a consumer queue of this console (redirect only to a queue it shows)"))
		return
	}
	group := r.PathValue("group")
	operator := c.cfg.Operator(r)
	ru := c.newRun("replay", replayledger.NewRun("run"), q.Poison, group, operator)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.runReplay(ru, q, group, operator, plan)
	}()
	http.Redirect(w, r, c.cfg.Prefix+"/runs/"+ru.ID, http.StatusSeeOther)
}

// replayConfig is a replay of group from q's poison queue to to ("": each
// message's own queue): its targets only the console's consumer queues,
// whatever a message names — the dry run and the replay choose them alike
// (dlq.Queue.Target).
func (c *Console) replayConfig(q Queue, group, to string) dlq.ReplayConfig {
	return dlq.ReplayConfig{Filter: dlq.Filter{Group: group}, To: to, Targets: c.consumerQueues()}
}

// targetLabel is where a replay to each message's own queue sends m, as the
// dry run shows it: the queue, or why there is none (refused: the replay
// would stop on m). It asks pq.Target once a message: with a Signer, that
// verifies the message's signature.
func targetLabel(pq *dlq.Queue, cfg dlq.ReplayConfig, m *dlq.Message) (label string, refused bool) {
	t, err := pq.Target(cfg, m)
	named := diag.Printable(m.Queue, 255)
	switch {
	case err == nil:
		return diag.Printable(t, 255), false
	case errors.Is(err, dlq.ErrUnreadable):
		return "(none: its headers could not be read)", true
	case errors.Is(err, dlq.ErrTargetRefused):
		return named + " (refused: not a consumer queue of this console)", true
	case m.Queue != "":
		return named + " (refused: its diagnosis is not signed with the console's key)", true
	}
	return "(none: not replayable)", true
}

func loopForm(r *http.Request) (loopPlan, error) {
	var sizes []int
	canary, err := strconv.Atoi(cmp.Or(strings.TrimSpace(r.PostFormValue("canary")), "0"))
	if err != nil || canary < 0 {
		return loopPlan{}, errors.New("canary: want a number of messages, 0 for none")
	}
	if canary > 0 {
		sizes = append(sizes, canary)
	}
	if ramp := strings.TrimSpace(r.PostFormValue("ramp")); ramp != "" {
		for _, p := range strings.Split(ramp, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 1 {
				return loopPlan{}, errors.New("ramp: want batch sizes such as 5,20,100")
			}
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		return loopPlan{}, errors.New("give a canary, a ramp, or both")
	}
	mr, err := strconv.ParseFloat(strings.TrimSuffix(cmp.Or(strings.TrimSpace(r.PostFormValue("max_repoison")), "10%"), "%"), 64)
	if err != nil || mr < 0 || mr > 100 {
		return loopPlan{}, errors.New("max re-poison: want a percentage such as 10%")
	}
	wait, err := time.ParseDuration(cmp.Or(strings.TrimSpace(r.PostFormValue("wait")), "30s"))
	if err != nil || wait <= 0 || wait > time.Hour {
		return loopPlan{}, errors.New("wait: want a duration such as 30s, at most 1h")
	}
	limit, err := strconv.Atoi(cmp.Or(strings.TrimSpace(r.PostFormValue("limit")), "0"))
	if err != nil || limit < 0 {
		return loopPlan{}, errors.New("limit: want a number of messages, 0 for all")
	}
	return loopPlan{sizes: sizes, canary: canary > 0, maxRepoison: mr / 100, wait: wait, limit: limit}, nil
}

// loopPlan is a replay form's closed loop.
type loopPlan struct {
	to          string // a consumer queue every message goes to instead of its own; "": its own
	sizes       []int
	canary      bool
	maxRepoison float64
	wait        time.Duration
	limit       int
}

func (c *Console) runReplay(ru *run, q Queue, group, operator string, p loopPlan) {
	release, err := c.reading(c.ctx, q.Poison, runReadWait)
	if err != nil {
		ru.finish(dlq.Result{}, err)
		return
	}
	defer release()
	defer c.forget(q.Poison)
	conn, err := c.conn()
	if err != nil {
		ru.finish(dlq.Result{}, err)
		return
	}
	defer c.hangUp(conn)
	cfg := c.replayConfig(q, group, p.to)
	cfg.Limit, cfg.Batch, cfg.Run = p.limit, 10, ru.ID
	cfg.Published = func(_ context.Context, ms []*dlq.Message) error {
		for _, m := range ms {
			ru.add(m.Item(), m.EventID, string(ledger.OutcomeReplayed), "", "")
		}
		return nil
	}
	l := dlq.Loop{Sizes: p.sizes, Canary: p.canary, MaxRepoison: p.maxRepoison, Store: c.cfg.Outcomes, Wait: p.wait, Where: c.cfg.OutcomesWhere,
		Batch: ru.batch, Source: "console"} // the loop keeps the run beside its outcomes
	res, err := dlq.Open(conn, q.Poison, dlq.Config{Operator: operator, Publisher: c.cfg.Publisher, Signer: c.signer}).ClosedLoop(c.ctx, cfg, l)
	ru.finish(res, err)
	c.audit(operator, "console replay", q.Poison, cfg.Filter, map[string]string{"run": ru.ID, "sizes": fmt.Sprint(p.sizes), "canary": strconv.FormatBool(p.canary),
		"max_repoison": strconv.FormatFloat(100*p.maxRepoison, 'f', -1, 64) + "%", "wait": p.wait.String(), "limit": strconv.Itoa(p.limit),
		"to": p.to}, res, err, "", nil)
}

func (c *Console) discard(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok {
		c.fail(w, r, http.StatusNotFound, errors.New("no such poison queue in the console's configuration"))
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" || r.PostFormValue("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, errors.New("a discard needs a reason and the confirmation box ticked"))
		return
	}
	a, ok := c.startAction(w, r, "discard", q.Poison)
	if !ok {
		return
	}
	defer a.done()
	ru, group, limit, operator, conn := a.run, a.group, a.limit, a.operator, a.conn
	f := dlq.Filter{Group: group}
	res, items, err := dlq.Open(conn, q.Poison, dlq.Config{}).Discard(r.Context(), f, max(limit, 0), false)
	err = errors.Join(err, c.record(r.Context(), ru, items, ledger.OutcomeDiscarded, reason, operator))
	ru.finish(res, err)
	c.keep(r.Context(), ru)
	c.audit(operator, "console discard", q.Poison, f, map[string]string{"run": ru.ID, "limit": strconv.Itoa(limit)}, res, err, reason, items)
	http.Redirect(w, r, c.cfg.Prefix+"/runs/"+ru.ID, http.StatusSeeOther)
}

// action is a discard's or an archive's run, begun: its group, limit and
// operator from the request, and a connection to the broker.
type action struct {
	run      *run
	group    string
	limit    int
	operator string
	conn     *amqp.Connection
	done     func() // closes conn and gives the queue back
}

// startAction begins the run of verb on poison, holding the queue for it
// (reading; a.done gives it back); false when another reader holds it past
// Config.CallTimeout or the broker cannot be reached (the run is then
// finished with the error, and the answer written).
func (c *Console) startAction(w http.ResponseWriter, r *http.Request, verb, poison string) (action, bool) {
	a := action{group: r.PathValue("group"), operator: c.cfg.Operator(r)}
	a.limit, _ = strconv.Atoi(r.PostFormValue("limit"))
	a.run = c.newRun(verb, replayledger.NewRun(verb), poison, a.group, a.operator)
	release, err := c.reading(r.Context(), poison, c.cfg.CallTimeout)
	if err != nil {
		a.run.finish(dlq.Result{}, err)
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return a, false
	}
	conn, err := c.conn()
	if err != nil {
		release()
		a.run.finish(dlq.Result{}, err)
		c.fail(w, r, http.StatusBadGateway, err)
		return a, false
	}
	a.conn = conn
	a.done = func() {
		c.hangUp(conn)
		c.forget(poison)
		release()
	}
	return a, true
}

func (c *Console) archive(w http.ResponseWriter, r *http.Request) {
	q, ok := c.poisonQueue(r.PathValue("queue"))
	if !ok || c.cfg.Archive == nil {
		c.fail(w, r, http.StatusNotFound, errors.New("archive is not offered here"))
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, errors.New("confirm the archive: tick the box on the preview"))
		return
	}
	a, ok := c.startAction(w, r, "archive", q.Poison)
	if !ok {
		return
	}
	defer a.done()
	ru, group, limit, operator, conn := a.run, a.group, a.limit, a.operator, a.conn
	sink, err := c.cfg.Archive()
	if err != nil {
		ru.finish(dlq.Result{}, err)
		c.fail(w, r, http.StatusBadGateway, diag.RedactError(err))
		return
	}
	f := dlq.Filter{Group: group}
	var items []string
	res, err := dlq.Open(conn, q.Poison, dlq.Config{Operator: operator, Signer: c.signer}).Archive(r.Context(), dlq.ArchiveConfig{Filter: f, Limit: max(limit, 0), Sink: sink,
		Archived: func(m *dlq.Message) { items = append(items, m.Item()) }})
	err = errors.Join(err, sink.Close(), c.record(r.Context(), ru, items, ledger.OutcomeArchived, "archived to "+sink.Name(), operator))
	ru.finish(res, err)
	c.keep(r.Context(), ru)
	c.audit(operator, "console archive", q.Poison, f, map[string]string{"run": ru.ID, "sink": sink.Name()}, res, err, "", nil)
	http.Redirect(w, r, c.cfg.Prefix+"/runs/"+ru.ID, http.StatusSeeOther)
}

// record writes what an operator did to each item into the outcome
// records (when configured) under the run, and into the run's rows.
func (c *Console) record(ctx context.Context, ru *run, items []string, outcome sluice.Outcome, reason, operator string) error {
	rs := make([]replay.Record, 0, len(items))
	for _, it := range items {
		ru.add(it, it, string(outcome), "", reason)
		rs = append(rs, replay.Record{Run: ru.ID, Item: it, EventID: it, Outcome: outcome,
			Reason: diag.Bound(reason, replay.ReasonMaxLength), Handler: "operator " + operator, At: time.Now().UTC()})
	}
	if c.cfg.Outcomes == nil || len(rs) == 0 {
		return nil
	}
	if err := c.storeCall(ctx, "writing the outcome records", func(ctx context.Context) error { return c.cfg.Outcomes.Records(ctx, rs) }); err != nil {
		return fmt.Errorf("recording the outcomes (the audit log has them): %w", diag.RedactError(err))
	}
	return nil
}

func (c *Console) audit(operator, command, queue string, f dlq.Filter, opts map[string]string, res dlq.Result, runErr error, reason string, items []string) {
	rec := dlq.AuditRecord{Time: time.Now().UTC(), Operator: operator, Command: command, Queue: queue, Filters: f.Describe(),
		Options: opts, Result: res, Outcome: "ok", Reason: reason, Items: items}
	if runErr != nil {
		rec.Outcome, rec.Error = "error", diag.Redact(runErr.Error())
	}
	if c.cfg.AuditFile != "" {
		_ = dlq.AppendAudit(c.cfg.AuditFile, rec) // the run page shows the error of the action itself
	}
}

// ---- outbox

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
	var n int64
	err := c.storeCall(r.Context(), "making the outbox's failing rows due", func(ctx context.Context) (err error) { n, err = o.RetryNow(ctx); return err })
	c.audit(c.cfg.Operator(r), "console outbox retry", name, dlq.Filter{}, nil, dlq.Result{Replayed: int(n)}, err, "", nil)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, diag.RedactError(err))
		return
	}
	http.Redirect(w, r, c.cfg.Prefix+"/outbox", http.StatusSeeOther)
}

// ---- audit

type auditRow struct {
	Time                                             time.Time
	Operator, Command, Queue, Outcome, Error, Reason string
	Filters                                          string
	Count                                            int
}

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	rows, err := readAudit(c.cfg.AuditFile)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.render(w, r, "audit", rows)
}

// readAudit reads the last lines of the audit log, newest first.
func readAudit(path string) ([]auditRow, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, diag.RedactError(err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(0, st.Size()-auditTail)
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), auditTail)
	var rows []auditRow
	first := off > 0
	for sc.Scan() {
		if first { // a line cut by the seek
			first = false
			continue
		}
		var rec dlq.AuditRecord
		if rec.UnmarshalJSON(sc.Bytes()) != nil {
			continue
		}
		var fs []string
		for _, k := range slices.Sorted(maps.Keys(rec.Filters)) {
			fs = append(fs, k+"="+rec.Filters[k])
		}
		rows = append(rows, auditRow{Time: rec.Time, Operator: diag.Printable(rec.Operator, textMax), Command: diag.Printable(rec.Command, 64),
			Queue: diag.Printable(rec.Queue, 255), Outcome: diag.Printable(rec.Outcome, 32), Error: diag.Printable(rec.Error, textMax),
			Reason: diag.Printable(rec.Reason, textMax), Filters: diag.Printable(strings.Join(fs, " "), textMax),
			Count: cmp.Or(rec.Result.Replayed, rec.Result.Selected)})
	}
	slices.Reverse(rows)
	return rows[:min(len(rows), auditMax)], nil
}
