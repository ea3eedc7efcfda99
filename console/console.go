// Package console is Sluice's operator console: an http.Handler a service
// mounts (or `sluice console` serves) over its poison queues, the replay
// outcome records, the outbox and the audit log. Pages are rendered on the
// server from embedded templates: no script, no build step, no download.
//
// Safe by default: every state-changing request is a POST that must carry
// the page's CSRF token and come from the console's own origin; ReadOnly
// refuses every one; Token, when set, is asked of every request; the
// Content-Security-Policy allows no script at all; every message field is
// escaped and bounded; no URL or DSN is ever rendered. Off loopback, a
// listener must authenticate: CheckAddr refuses an address that is not a
// loopback one unless every request is authenticated — by Config.Token, or
// by the host's own middleware.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/time/rate"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/signing"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Queue is one consumer queue the overview shows, with its retry tiers and
// its poison queue. Only the poison queues named here can be read or acted
// on through the console.
type Queue struct {
	Name   string
	Tiers  []string
	Poison string
}

// Depth is a queue's depth as the overview shows it.
type Depth struct {
	Ready, Unacked, Consumers int
	// UnackedKnown is false when the source cannot tell (a passive declare
	// counts only ready messages and consumers).
	UnackedKnown bool
	// Arrival is the messages published into the queue per second,
	// averaged by the source over its recent samples (the management API's
	// message_stats.publish_details.rate); ArrivalKnown is false when the
	// source cannot tell.
	Arrival      float64
	ArrivalKnown bool
}

// Outbox is what the console reads and does on an outbox table
// (sluicesql.Outbox implements it).
type Outbox interface {
	Stats(ctx context.Context) (outbox.Stats, error)
	List(ctx context.Context, failing bool, limit int) ([]OutboxEntry, error)
	RetryNow(ctx context.Context) (int64, error)
}

// OutboxEntry is one outbox row as the console lists it.
type OutboxEntry struct {
	ID        int64
	Topic     string
	EventID   string
	Attempts  int
	LastError string
	CreatedAt time.Time
}

// Config configures the console.
type Config struct {
	// Prefix is the path the console is mounted under ("/sluice"); "" is
	// the root. The handler strips it itself: mount it at Prefix+"/".
	Prefix string
	// Dial opens a connection to the broker, one per page or action. One
	// rabbitmq.Dial opens (as sluice console's does) has its waits bounded
	// by their progress (CallTimeout). Required.
	Dial func() (*amqp.Connection, error)
	// Publisher publishes replayed copies (confirmed, mandatory:
	// rabbitmq.Publisher). Without it replay is not offered.
	Publisher dlq.Publisher
	// Queues are the consumer queues the console shows and acts on.
	Queues []Queue
	// Depth reads a queue's depth; nil reads it with a passive declare
	// (ready and consumers; unacked unknown).
	Depth func(ctx context.Context, queue string) (Depth, error)
	// Outcomes are the replay outcome records (the service's replay store,
	// sluicesql.Outcomes or sluiceredis.Outcomes on the host's own connection);
	// without them the closed loop is not offered. OutcomesWhere names their
	// place in a stopped replay's reason ("table T", "key prefix P:"); ""
	// names none.
	Outcomes      ledger.Ledger
	OutcomesWhere string
	// Outboxes are shown on the outbox page by name.
	Outboxes map[string]Outbox
	// AuditFile is the audit log every action appends to, and the audit
	// page reads (its tail). Required unless ReadOnly.
	AuditFile string
	// Archive opens where archived messages go; nil: archive not offered.
	Archive func() (dlq.ArchiveSink, error)
	// Env is the console's environment (a sluice.Env). It reads Signer, a
	// *signing.Signer (the consumers' key), which signs replayed copies and
	// archive records, as sluice dlq replay --signing-key-file (New refuses
	// another kind); Logger, a line per failed sign-in (a wrong Token: the
	// client's address, never the token tried; default the process's
	// slog.Default, through watermill.NewSlogLogger); Clock, which times the
	// sign-in throttle (default sluice.SystemClock()).
	sluice.Env
	// Operator names who made a request, for the audit log; nil: "console".
	Operator func(*http.Request) string
	// ReadOnly refuses every action.
	ReadOnly bool
	// Token, when set, is asked of every request: a browser signs in once
	// (a cookie, HttpOnly, SameSite=Strict), a script sends it as
	// "Authorization: Bearer <token>". Failed sign-ins are throttled per
	// client address (5 at once, then one each 2 s; 429 with Retry-After;
	// 10,000 addresses remembered, the others sharing one allowance) and
	// logged.
	Token string
	// SampleInterval is how often the console reads the depth of each
	// family's main and poison queue, from New until Close, for the
	// overview's chart. Default 10 s; negative:
	// only when the overview loads.
	SampleInterval time.Duration
	// CallTimeout bounds each wait of a page, an action or a chart's
	// sample on the broker — a depth's passive declare, with its channel's
	// opening and close, a connection's close — and on the stores (the
	// outbox's and the outcome records' calls): a dependency that does not
	// answer (a black-holed broker or database: the connection up, nothing
	// coming back) fails the wait with an error naming it, where it held
	// the page until the AMQP heartbeat, or the kernel, gave the connection
	// up. The end of the request ends them too, and a sample's the
	// SampleInterval. It bounds too how long a page or an action waits
	// while another page, action or replay run of this console reads the
	// same poison queue (one reader at a time: two would each see part of
	// it and put back their parts interleaved); past it the answer is
	// ErrQueueBusy, or the groups page's last summary. A scan's reads of a
	// poison queue are bounded by the dlq package's own bound (10 s) each;
	// Dial by its own (rabbitmq.Dial's DialTimeout). On a connection
	// rabbitmq.Dial opened, a wait on the broker is bounded by the time
	// without progress (no frame but heartbeats), up to 30 times the bound
	// in all — a large message's transfer is not cut; on one Dial opened
	// otherwise (amqp.Dial), by the whole call. Default 10 s.
	CallTimeout time.Duration
}

// callTimeoutDefault is Config.CallTimeout's default, the dlq package's
// bound of each of a scan's calls.
const callTimeoutDefault = 10 * time.Second

// groupsMax bounds the failure groups a scan keeps (the rest are counted
// as "other"); pageSize the messages of a page.
const (
	groupsMax = 1000
	pageSize  = 50
)

// Console is the console's handler. Close stops the runs it started and
// waits for them.
type Console struct {
	cfg    Config
	signer *signing.Signer // cfg.Signer's
	mux    *http.ServeMux
	tmpl   map[string]*template.Template
	csrf   string // the token every form carries
	cookie string // the session cookie's value when Token is set
	cop    *http.CrossOriginProtection
	logins throttle // failed sign-ins per client address

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	runs    map[string]*run
	order   []string // run ids, oldest first
	samples map[string][]sample
	// readers: one reader of a poison queue at a time (reading);
	// summaries: the groups page's last scan of each (cached).
	readers   map[string]chan struct{}
	summaries map[string]summary
}

// ErrNoAuth refuses to serve off loopback without authentication.
var ErrNoAuth = errors.New("console: refusing to listen off loopback without authentication: set Config.Token, or put the console behind your service's own authentication")

// CheckAddr is what whoever opens the console's listener asks first: it
// returns ErrNoAuth when addr is not a loopback address and the requests
// are not authenticated — authenticated is true when Config.Token is set
// (cfg.Token != "") or the host's own middleware authenticates every
// request before the console sees it. An empty host (":8080") listens on
// every interface: not loopback.
func CheckAddr(addr string, authenticated bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console: address %q: %w", addr, err)
	}
	if authenticated {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return ErrNoAuth
}

// New returns the console: an http.Handler (riverui-style: mount it under
// cfg.Prefix) whose Close stops the runs it started.
func New(cfg Config) (*Console, error) {
	if cfg.Dial == nil {
		return nil, errors.New("console: Config.Dial is required")
	}
	if !cfg.ReadOnly && cfg.AuditFile == "" {
		return nil, errors.New("console: Config.AuditFile is required unless ReadOnly (every action is audited)")
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	if cfg.Prefix != "" && !strings.HasPrefix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("console: Prefix %q must start with /", cfg.Prefix)
	}
	if cfg.SampleInterval == 0 {
		cfg.SampleInterval = sampleIntervalDefault
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = callTimeoutDefault
	}
	if cfg.Operator == nil {
		cfg.Operator = func(*http.Request) string { return "console" }
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NewSlogLogger(nil)
	}
	if cfg.Clock == nil {
		cfg.Clock = sluice.SystemClock()
	}
	signer, ok := cfg.Signer.(*signing.Signer)
	if cfg.Signer != nil && !ok {
		return nil, fmt.Errorf("console: Config.Env.Signer must be a *signing.Signer (the key the dlq's copies and records are signed with), got %T", cfg.Signer)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, signer: signer, runs: map[string]*run{}, samples: map[string][]sample{}, cop: http.NewCrossOriginProtection(),
		readers: map[string]chan struct{}{}, summaries: map[string]summary{}, logins: throttle{clients: map[string]*rate.Limiter{}}}
	c.csrf = mac(key, "csrf")
	if cfg.Token != "" {
		c.cookie = mac([]byte(cfg.Token), "session")
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if err := c.parse(); err != nil {
		return nil, err
	}
	c.routes()
	if cfg.SampleInterval > 0 {
		c.wg.Add(1)
		go c.sampleLoop()
	}
	return c, nil
}

func mac(key []byte, what string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(what))
	return hex.EncodeToString(h.Sum(nil))
}

// Close cancels the runs in progress (a batch already published stays
// published; its outcomes still come) and the depth reads, and waits for
// them.
func (c *Console) Close() error {
	c.cancel()
	c.wg.Wait()
	return nil
}

const csp = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// ServeHTTP serves the console: headers first, then authentication, then
// the CSRF and read-only checks of a POST.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	path, ok := strings.CutPrefix(r.URL.Path, c.cfg.Prefix)
	if !ok || (path != "" && !strings.HasPrefix(path, "/")) {
		http.NotFound(w, r)
		return
	}
	if path == "" {
		path = "/"
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "refused: a form that cannot be read", http.StatusBadRequest)
			return
		}
		if err := c.cop.Check(r); err != nil {
			http.Error(w, "refused: a cross-origin request", http.StatusForbidden)
			return
		}
	}
	if c.cfg.Token != "" && path != "/login" && path != "/static/console.css" {
		_, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if bearer && c.throttled(w, r) {
			return
		}
		if !c.authenticated(r) {
			if bearer {
				c.failed(r, "bearer")
			}
			http.Redirect(w, r, c.cfg.Prefix+"/login", http.StatusSeeOther)
			return
		}
	}
	if r.Method == http.MethodPost && path != "/login" {
		if c.cfg.ReadOnly {
			http.Error(w, "refused: the console is read-only", http.StatusForbidden)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(c.csrf)) != 1 {
			http.Error(w, "refused: the form's CSRF token is missing or wrong (reload the page)", http.StatusForbidden)
			return
		}
	}
	r2 := r.Clone(r.Context()) // with the form parsed above
	r2.URL.Path = path
	r2.URL.RawPath = ""
	c.mux.ServeHTTP(w, r2)
}

const cookieName = "sluice_console"

func (c *Console) authenticated(r *http.Request) bool {
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return subtle.ConstantTimeCompare([]byte(v), []byte(c.cfg.Token)) == 1
	}
	ck, err := r.Cookie(cookieName)
	return err == nil && subtle.ConstantTimeCompare([]byte(ck.Value), []byte(c.cookie)) == 1
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Token == "" {
		http.Redirect(w, r, c.cfg.Prefix+"/", http.StatusSeeOther)
		return
	}
	if r.Method == http.MethodPost {
		if c.throttled(w, r) {
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(c.cfg.Token)) == 1 {
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: c.cookie, Path: c.cfg.Prefix + "/",
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			http.Redirect(w, r, c.cfg.Prefix+"/", http.StatusSeeOther)
			return
		}
		c.failed(r, "form")
		w.WriteHeader(http.StatusUnauthorized)
		c.render(w, r, "login", map[string]any{"Wrong": true})
		return
	}
	c.render(w, r, "login", nil)
}
