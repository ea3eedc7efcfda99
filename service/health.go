package service

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/router"
)

// A check's and a report's Status: "pass" or "fail".
const (
	statusPass = "pass"
	statusFail = "fail"
)

// errorMaxLength bounds a check's Error, in bytes.
const errorMaxLength = 512

// connectedSubscriber is a subscriber that can tell whether its
// subscriptions hold a live connection to the broker (a Connected() bool
// method, as rabbitmq's Consumer has): the readiness report reads it from
// each handler's broker subscriber that has one, and says nothing of the
// connection for one that does not.
type connectedSubscriber interface {
	Connected() bool
}

// Report is a health report: Status is "fail" when any check failed, else
// "pass". Health serves it as JSON.
type Report struct {
	Status string           `json:"status"`
	Checks map[string]Check `json:"checks"`
}

// Check is one check of a Report; the fields beside Status and Error are
// those the check reads.
type Check struct {
	// Status is "pass" or "fail".
	Status string `json:"status"`
	// Error says why the check failed: bounded, with secrets redacted.
	Error string `json:"error,omitempty"`
	// Running: the router runs the handler (all its consumers), or the
	// relay runs.
	Running *bool `json:"running,omitempty"`
	// Connected: the handler's subscriber holds a live connection (only for
	// a subscriber with a Connected() bool method).
	Connected *bool `json:"connected,omitempty"`
	// Brake is the handler's brake's state: released, engaged, probing.
	Brake string `json:"brake,omitempty"`
	// Pending, Failing and OldestAgeSeconds are the outbox's: rows not yet
	// relayed, rows whose last publish failed, and the oldest row's age —
	// how far behind the relay is (0 when the outbox is empty).
	Pending          *int64   `json:"pending,omitempty"`
	Failing          *int64   `json:"failing,omitempty"`
	OldestAgeSeconds *float64 `json:"oldest_age_seconds,omitempty"`
}

// Live reports whether the service works, in the sense of a Kubernetes
// liveness probe — failing only where a restart helps: the router ran its
// handlers and they stopped although the service was not closed (their
// subscriptions ended), or the relay stopped by itself. An outage of the
// database or the broker is not one: the brake holds the deliveries back.
func (s *Service) Live(context.Context) Report {
	checks := map[string]Check{}
	for _, a := range s.snapshot() {
		running, started := s.running(a)
		c := pass()
		if started && !running && !s.isClosing() {
			c = fail("the handler stopped: its subscription ended")
		}
		checks["handler:"+a.name] = c
	}
	if s.relay != nil {
		checks["outbox"] = s.relayCheck()
	}
	return report(checks)
}

// Ready reports whether the service consumes, in the sense of a Kubernetes
// readiness probe: each handler runs, its subscriber is connected (a
// subscriber with a Connected() bool method) and its brake released; the database answers its
// ping; the relay runs. The outbox's counts and the oldest row's age are
// reported, not judged (the SluiceOutboxStuck alert does that). Each check
// that waits on the database is bounded by HealthTimeout.
func (s *Service) Ready(ctx context.Context) Report {
	checks := map[string]Check{}
	for _, a := range s.snapshot() {
		running, started := s.running(a)
		c := Check{Status: statusPass, Running: &running}
		var reasons []string
		switch {
		case !started:
			reasons = append(reasons, "the router does not run the handler yet")
		case !running:
			reasons = append(reasons, "the handler stopped")
		}
		if cs, ok := a.subscriber.(connectedSubscriber); ok {
			connected := cs.Connected()
			c.Connected = &connected
			if !connected {
				reasons = append(reasons, "the subscriber is not connected to the broker")
			}
		}
		if b := router.Brake(s.cfg.Router, a.name); b != nil {
			c.Brake = b.State().String()
			if b.State() != brake.Released {
				reasons = append(reasons, "the brake is "+c.Brake+": a dependency fails, consuming stopped")
			}
		}
		if len(reasons) > 0 {
			c.Status, c.Error = statusFail, strings.Join(reasons, "; ")
		}
		checks["handler:"+a.name] = c
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	set := func(name string, c Check) {
		mu.Lock()
		defer mu.Unlock()
		checks[name] = c
	}
	wg.Go(func() {
		_, _, err := bounded.Run(s.calls, ctx, s.cfg.HealthTimeout, false, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, s.stores.Inbox.Ping(ctx)
		}, nil)
		if err != nil {
			set("database", fail(diag.Summary(err, errorMaxLength)))
			return
		}
		set("database", pass())
	})
	wg.Go(func() {
		c := pass()
		if s.relay != nil {
			c = s.relayCheck()
		}
		st, err := s.outboxStats(ctx, s.cfg.HealthTimeout)
		if err != nil {
			set("outbox", fail(diag.Summary(err, errorMaxLength)))
			return
		}
		age := 0.0
		if !st.Oldest.IsZero() {
			age = max(time.Since(st.Oldest).Seconds(), 0)
		}
		c.Pending, c.Failing, c.OldestAgeSeconds = &st.Pending, &st.Failing, &age
		set("outbox", c)
	})
	wg.Wait()
	return report(checks)
}

// Health serves the reports as JSON in the shape Kubernetes probes expect:
// a path ending in "/livez" the liveness report (Live), one ending in
// "/readyz" the readiness report (Ready); 200 when it passes, 503 when it
// fails. Any other path is 404, naming the two: a liveness probe pointed at
// "/healthz" must not read the readiness report, which fails during a
// database outage and would have every instance restarted. Mount it at
// both: mux.Handle("/livez", h); mux.Handle("/readyz", h).
func (s *Service) Health() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		var r Report
		switch {
		case strings.HasSuffix(req.URL.Path, "/livez"):
			r = s.Live(req.Context())
		case strings.HasSuffix(req.URL.Path, "/readyz"):
			r = s.Ready(req.Context())
		default:
			http.Error(w, "not found: the health handler answers a path ending in /livez (liveness) or /readyz (readiness)", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if r.Status != statusPass {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		if req.Method == http.MethodGet {
			_ = json.NewEncoder(w).Encode(r)
		}
	})
}

func pass() Check              { return Check{Status: statusPass} }
func fail(reason string) Check { return Check{Status: statusFail, Error: reason} }
func report(c map[string]Check) Report {
	r := Report{Status: statusPass, Checks: c}
	for _, c := range c {
		if c.Status != statusPass {
			r.Status = statusFail
		}
	}
	return r
}

// relayCheck says whether the relay runs: started with the router, not
// stopped before the service closed.
func (s *Service) relayCheck() Check {
	s.mu.Lock()
	run, started := s.relayRun, s.started
	s.mu.Unlock()
	running := started && !isDone(run)
	c := pass()
	if started && !running && !s.isClosing() {
		c = fail("the relay stopped")
	}
	c.Running = &running
	return c
}

func (s *Service) snapshot() []added {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]added(nil), s.handlers...)
}

// running reports whether every consumer of a runs, and whether the router
// started them: its handlers' Stopped channels are read only once the
// router runs (Watermill sets them when it starts the handlers).
func (s *Service) running(a added) (running, started bool) {
	if !isDone(s.cfg.Router.Running()) {
		return false, false
	}
	for _, h := range a.handlers {
		if isDone(h.Stopped()) {
			return false, true
		}
	}
	return true, true
}

// isClosing reports whether the service is closing: Close was called, or
// the router has closed.
func (s *Service) isClosing() bool { return isDone(s.closing) || isDone(s.stopping) }

// isDone reports whether c is closed; a nil c is not.
func isDone(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}
