package console

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
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
		"readsLabel": func() string { return readsLabel },
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
