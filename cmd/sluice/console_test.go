package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/console"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay/ledger"
)

// consoleOn serves the console over the bed's family on a loopback test
// server, with the outcome records when outcomes is set.
func consoleOn(t testing.TB, b *bed, outcomes string, mutate func(*console.Config)) (string, *console.Console) {
	t.Helper()
	cfg := console.Config{
		Prefix: "/sluice",
		Dial: func() (*amqp.Connection, error) {
			return rabbitmq.Dial(rabbitmq.Connection{URL: testenv.AMQPURL}, "console test")
		},
		Publisher: b.pub,
		Queues:    []console.Queue{{Name: b.topo.Config().Queue, Tiers: []string{b.topo.Tiers()[0].Topic}, Poison: b.topo.Config().PoisonQueue}},
		AuditFile: b.audit,
		Operator:  func(*http.Request) string { return "tester" },
	}
	if outcomes != "" {
		store, done, err := openOutcomes(t.Context(), testenv.PostgresURL, outcomes, false)
		require.NoError(t, err)
		t.Cleanup(done)
		cfg.Outcomes, cfg.OutcomesWhere = store, outcomesPlace(testenv.PostgresURL, outcomes)
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := console.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(func() { srv.Close(); require.NoError(t, c.Close()) })
	return srv.URL + "/sluice", c
}

// browser returns a tab of the package's headless Chromium (Debian's,
// started by the first test that asks: sharedBrowser) in a browser context
// of t's own — cookies, storage and cache of its own, as a fresh profile's
// — closed when t ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	bctx := sharedBrowser(t)
	ctx, cancel := chromedp.NewContext(bctx, chromedp.WithNewBrowserContext())
	ctx, cancelT := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { cancelT(); cancel() })
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank"))) // open the tab now: a failure names the browser
	return ctx
}

// shot saves a full-page screenshot for docs/console.md when
// SLUICE_CONSOLE_SCREENSHOTS names a directory (make console-screenshots).
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("SLUICE_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// groupOf returns the failure group of the poison queue's message with
// event id id, read from the broker (everything stays).
func groupOf(t testing.TB, queue, id string) string {
	t.Helper()
	var g string
	_, err := dlq.Open(testenv.AMQP(t), queue, dlq.Config{}).Each(t.Context(), dlq.Filter{}, 0, func(m *dlq.Message) error {
		if m.EventID == id && g == "" {
			g = m.Group()
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, g, "no %s in %s", id, queue)
	return g
}

// textOf is the text content of the first element matching sel.
func textOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err)
	return s
}

// do runs the steps in the browser.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// eval evaluates a JavaScript expression in the page (through DevTools: the
// page's own Content-Security-Policy allows no script).
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err)
	return v
}

// runID is the run of the run page the browser shows.
func runID(t *testing.T, ctx context.Context) string {
	t.Helper()
	u, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	return u[strings.LastIndex(u, "/")+1:]
}

// reloaded reports whether err is a read that met the page's own reload:
// its context ("Cannot find context with specified id") or the node it
// had found ("No node with given id found", run F) is gone, or the page
// was navigating ("Inspected target navigated or closed": a confirm's
// read as its form's answer loaded, in make test).
func reloaded(err error) bool {
	for _, s := range []string{"Cannot find context", "No node with given id", "Inspected target navigated or closed"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

// readAcrossReloads runs read in the page, again while it meets the page's
// own reload (a run's page reloads itself each second while the run runs),
// within 30 s; any other error fails t.
func readAcrossReloads[T any](t *testing.T, ctx context.Context, read chromedp.Action[T]) T {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		v, err := chromedp.Run(ctx, read)
		if err != nil && reloaded(err) && time.Now().Before(deadline) {
			do(t, ctx, chromedp.Sleep(100*time.Millisecond))
			continue
		}
		require.NoError(t, err)
		return v
	}
}

// awaitRun reads a run's page until its state is no longer running.
func awaitRun(t *testing.T, ctx context.Context) string {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		state := readAcrossReloads(t, ctx, chromedp.Text(chromedp.CSS("#state")))
		if !strings.HasPrefix(state, "Running") {
			return state
		}
		require.True(t, time.Now().Before(deadline), "the run did not end within 90 s")
		// No reload of ours: one that met the page's own failed with
		// net::ERR_ABORTED in make test. The page reloads itself.
		do(t, ctx, chromedp.Sleep(300*time.Millisecond))
	}
}

// confirm fills a preview's form and submits it.
func confirm(t *testing.T, ctx context.Context, fields map[string]string) {
	t.Helper()
	var acts []chromedp.Action[chromedp.Void]
	for k, v := range fields {
		acts = append(acts, chromedp.SetValue(chromedp.CSS(`input[name="`+k+`"]`), v))
	}
	do(t, ctx, acts...)
	eval[bool](t, ctx, `document.querySelector('input[name="confirm"]').checked = true`)
	do(t, ctx, chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#state, #error, pre`)))
	if readAcrossReloads(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll('#error, pre').length`)) != 0 {
		require.Failf(t, "an error page", "%s", textOf(t, ctx, "body")) // the body read only for the message
	}
}

// The console in a browser, checked against the broker and the outcome
// table: the overview, a group, a canary replay of a group whose fix
// landed (processed) and of one whose fix did not (stopped on re-poison),
// the outcome column, and a discard with a reason.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.goodAndBad(t, 6, 3)
	b.poisoned(t, "junk-1", "stock.reserved", sluice.Poison(errors.New("payload is not JSON")))
	rc := newRecovering(t, b, func(id string) bool { return strings.HasPrefix(id, "bad-") })
	base, _ := consoleOn(t, b, rc.outcomesTable, nil)
	pq := b.topo.Config().PoisonQueue
	good, bad, junk := groupOf(t, pq, "good-000"), groupOf(t, pq, "bad-00"), groupOf(t, pq, "junk-1")
	ctx := browser(t)

	do(t, ctx, chromedp.Navigate(base+"/"))
	overview := textOf(t, ctx, "main")
	require.Contains(t, overview, pq)
	require.Contains(t, overview, "Failure groups in "+pq+" (10)")
	shot(t, ctx, "overview")

	do(t, ctx, chromedp.Click(chromedp.CSS(`a.groups`)), chromedp.WaitVisible(chromedp.CSS(`#groups`)))
	groups := eval[int](t, ctx, `document.querySelectorAll('#groups tbody tr').length`)
	require.Equal(t, 3, groups, "good, bad, junk")
	shot(t, ctx, "groups")

	do(t, ctx, chromedp.Navigate(base+"/q/"+pq+"/g/"+good))
	messages := eval[int](t, ctx, `document.querySelectorAll('details.message').length`)
	eval[bool](t, ctx, `document.querySelector('details.message').open = true`)
	require.Equal(t, 6, messages)
	shot(t, ctx, "group")

	// The fixed group: a canary of 1, then batches of 5, all processed.
	do(t, ctx, chromedp.Click(chromedp.CSS(`#replay`)), chromedp.WaitVisible(chromedp.CSS(`#count`)))
	require.Contains(t, textOf(t, ctx, "#count"), "6 messages selected")
	shot(t, ctx, "replay-preview")
	require.Equal(t, 10, len(peekIDs(t, pq)), "the dry run moved nothing")
	confirm(t, ctx, map[string]string{"canary": "1", "ramp": "5", "wait": "60s"})
	require.Equal(t, "Done.", awaitRun(t, ctx))
	outcomes := eval[[]string](t, ctx, `[...document.querySelectorAll('#outcomes td.outcome')].map(e => e.textContent)`)
	require.Equal(t, []string{"processed", "processed", "processed", "processed", "processed", "processed"}, outcomes)
	shot(t, ctx, "replay-done")
	run := runID(t, ctx)
	store, done, err := openOutcomes(t.Context(), testenv.PostgresURL, rc.outcomesTable, false)
	require.NoError(t, err)
	defer done()
	rs, err := store.Outcomes(t.Context(), run)
	require.NoError(t, err)
	processed := 0
	for _, r := range rs {
		if r.Outcome == sluice.OutcomeProcessed {
			processed++
		}
	}
	require.Equal(t, 6, processed, "the outcome table: %v", rs)
	require.Equal(t, 6, rc.rows(t), "one business row per good event")
	for _, id := range peekIDs(t, pq) {
		require.False(t, strings.HasPrefix(id, "good-"), "a processed event left in the poison queue")
	}

	// The unfixed group: the canary is poisoned again, the run stops.
	do(t, ctx, chromedp.Navigate(base+"/q/"+pq+"/g/"+bad+"/replay"), chromedp.WaitVisible(chromedp.CSS(`#count`)))
	confirm(t, ctx, map[string]string{"canary": "1", "ramp": "5", "wait": "60s"})
	require.Equal(t, "Stopped.", awaitRun(t, ctx))
	require.Contains(t, textOf(t, ctx, "#why"), "1 of the 1 canary events were not processed")
	require.Equal(t, "poisoned", textOf(t, ctx, "#outcomes td.outcome"))
	require.Contains(t, textOf(t, ctx, "#outcomes"), "unknown schema version 3")
	shot(t, ctx, "replay-stopped")
	rs, err = store.Outcomes(t.Context(), runID(t, ctx))
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.Equal(t, sluice.OutcomePoisoned, rs[0].Outcome)
	require.ElementsMatch(t, []string{"junk-1", "bad-00", "bad-01", "bad-02"}, peekIDs(t, pq), "the canary is back, poisoned again; the rest never moved")

	// Discard with a reason.
	do(t, ctx, chromedp.Navigate(base+"/q/"+pq+"/g/"+junk+"/discard"), chromedp.WaitVisible(chromedp.CSS(`#count`)))
	confirm(t, ctx, map[string]string{"reason": "garbage from the load test"})
	require.Equal(t, "Done.", awaitRun(t, ctx))
	require.Equal(t, "discarded", textOf(t, ctx, "#outcomes td.outcome"))
	require.ElementsMatch(t, []string{"bad-00", "bad-01", "bad-02"}, peekIDs(t, pq))
	rs, err = store.Outcomes(t.Context(), runID(t, ctx))
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.Equal(t, ledger.OutcomeDiscarded, rs[0].Outcome)
	require.Equal(t, "garbage from the load test", rs[0].Reason)
	var last dlq.AuditRecord
	for _, a := range b.auditLines(t) {
		last = a
	}
	require.Equal(t, "console discard", last.Command)
	require.Equal(t, "garbage from the load test", last.Reason)
	require.Equal(t, []string{"junk-1"}, last.Items)

	do(t, ctx, chromedp.Navigate(base+"/audit"))
	require.Contains(t, textOf(t, ctx, "#audit"), "console discard")
	shot(t, ctx, "audit")
}

// Hostile contents render inert and bounded: a payload and headers with
// <script>, an event handler, terminal escapes, invalid UTF-8 and a 1 MB
// value; no script runs, no element is injected, the page stays small.
func TestConsoleRendersHostileContentsInert(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mw, err := poison.New(poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue})
	require.NoError(t, err)
	payload := append([]byte("<script>window.__pwned=1</script>\x1b[2J\xff\xfe"), strings.Repeat("A", 1<<20)...)
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set(sluice.EventIDKey, `evt-<img src=x onerror="window.__pwned=2">`)
	m.Metadata.Set(sluice.EventTypeKey, "\x1b]0;pwned\x07\u202eevil")
	m.Metadata.Set("x-big", strings.Repeat("B", 1<<20))
	m.Metadata.Set("x-bad-utf8", "\xff\xfe<b>bold</b>")
	_, err = mw(func(*message.Message) ([]*message.Message, error) {
		return nil, sluice.Poison(errors.New("<script>window.__pwned=3</script> bad \"quote\" \x1b[31mred"))
	})(m)
	require.NoError(t, err)
	base, _ := consoleOn(t, b, "", nil)
	pq := b.topo.Config().PoisonQueue
	ctx := browser(t)

	for _, path := range []string{"/", "/q/" + pq + "/groups", "/q/" + pq + "/g/" + groupOf(t, pq, `evt-<img src=x onerror="window.__pwned=2">`)} {
		do(t, ctx, chromedp.Navigate(base+path))
		eval[bool](t, ctx, `document.querySelectorAll('details').forEach(d => d.open = true), true`)
		pwned := eval[string](t, ctx, `String(window.__pwned)`)
		scripts := eval[int](t, ctx, `document.querySelectorAll('script').length`)
		imgs := eval[int](t, ctx, `document.querySelectorAll('img, b').length`)
		size := eval[int](t, ctx, `document.documentElement.outerHTML.length`)
		require.Equal(t, "undefined", pwned, "%s: a script ran", path)
		require.Zero(t, scripts, "%s: a script element was injected", path)
		require.Zero(t, imgs, "%s: markup from the message became elements", path)
		require.Less(t, size, 200_000, "%s: bounded, not megabytes", path)
	}
	body := textOf(t, ctx, "#messages")
	require.Contains(t, body, "<script>window.__pwned=1</script>", "shown as text")
	require.Contains(t, body, `\x1b`, "terminal escapes shown escaped")
	require.NotContains(t, body, "\x1b")
	shot(t, ctx, "hostile")
}

// Safe by default: off loopback the console refuses to start without
// authentication; a cross-site POST and a POST without the form's token
// are refused; read-only refuses every action; a token is asked for.
func TestConsoleRefusesWhatIsNotSafe(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":8080", "192.0.2.1:80"} {
		require.ErrorIs(t, console.CheckAddr(addr, false), console.ErrNoAuth, addr)
		require.NoError(t, console.CheckAddr(addr, true), addr) // a Token, or the host's own middleware
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0"} {
		require.NoError(t, console.CheckAddr(addr, false), addr)
	}
	b := newBed(t)
	code, _, errOut := b.cli(t, "console", "--addr", "0.0.0.0:0", "--queue", b.topo.Config().Queue)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "refusing to listen off loopback without authentication")
	// With --token-file the address passes (the command stops at the next
	// check, an audit log it cannot write, before it listens).
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("0123456789abcdef\n"), 0o600))
	code, _, errOut = b.cli(t, "console", "--addr", "0.0.0.0:0", "--token-file", tokenFile, "--queue", b.topo.Config().Queue,
		"--audit", filepath.Join(t.TempDir(), "missing", "audit.jsonl"))
	require.Equal(t, 1, code, errOut)
	require.NotContains(t, errOut, "refusing to listen")
	require.Contains(t, errOut, "the audit log cannot be written")

	b.poisoned(t, "e1", "order.created", sluice.Poison(errors.New("bad")))
	pq := b.topo.Config().PoisonQueue
	g := groupOf(t, pq, "e1")
	base, _ := consoleOn(t, b, "", nil)
	discard := base + "/q/" + pq + "/g/" + g + "/discard"
	form := url.Values{"reason": {"r"}, "confirm": {"yes"}}

	post := func(u string, v url.Values, h map[string]string) int {
		req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(v.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, x := range h {
			req.Header.Set(k, x)
		}
		cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := cl.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, post(discard, form, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}))
	require.Equal(t, http.StatusForbidden, post(discard, form, nil), "no CSRF token")
	form.Set("csrf", "0000")
	require.Equal(t, http.StatusForbidden, post(discard, form, nil), "a wrong CSRF token")
	require.Equal(t, []string{"e1"}, peekIDs(t, pq), "nothing moved")

	ctx := browser(t)
	ro, _ := consoleOn(t, b, "", func(c *console.Config) { c.ReadOnly = true })
	do(t, ctx, chromedp.Navigate(ro+"/q/"+pq+"/g/"+g))
	require.NotContains(t, textOf(t, ctx, "main"), "Discard")
	full, _ := consoleOn(t, b, "", nil)
	do(t, ctx, chromedp.Navigate(full+"/q/"+pq+"/g/"+g+"/discard"))
	csrf, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`input[name="csrf"]`)))
	require.NoError(t, err)
	form.Set("csrf", csrf)
	require.Equal(t, http.StatusForbidden, post(strings.Replace(discard, base, ro, 1), form, nil), "read-only, even with a token")
	require.Equal(t, []string{"e1"}, peekIDs(t, pq), "nothing moved")

	tok, _ := consoleOn(t, b, "", func(c *console.Config) { c.Token = "0123456789abcdef" })
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Get(tok + "/")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "signed out: to the sign-in form")
	do(t, ctx, chromedp.Navigate(tok+"/"), chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "0123456789abcdef"),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)), chromedp.WaitVisible(chromedp.CSS(`section.family`)))
}
