package console

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"golang.org/x/time/rate"

	"github.com/sluicemq/sluice/internal/diag"
)

// The throttle of failed sign-ins (a wrong token in the sign-in form or in
// an Authorization header), per client address.
const (
	// loginFailuresBurst is how many failed sign-ins a client address may
	// make at once; after them, one more each loginFailureInterval.
	loginFailuresBurst = 5
	// loginFailureInterval is how often a throttled address may try again.
	loginFailureInterval = 2 * time.Second
	// loginClientsMax bounds the addresses the throttle remembers; past it,
	// addresses it does not know share one allowance.
	loginClientsMax = 10_000
)

// throttle counts failed sign-ins per client address (the connection's,
// never a header a client writes): a token bucket each, in bounded memory.
type throttle struct {
	mu      sync.Mutex
	clients map[string]*rate.Limiter
	swept   time.Time
}

// overflow is the allowance the addresses share once loginClientsMax are
// remembered.
const overflow = "(other addresses)"

// clientOf is r's client address: the connection's host, without its port.
func clientOf(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// limiter returns addr's bucket, creating it within the bound; the caller
// holds t.mu.
func (t *throttle) limiter(addr string, now time.Time) *rate.Limiter {
	if l, ok := t.clients[addr]; ok {
		return l
	}
	if len(t.clients) >= loginClientsMax && now.Sub(t.swept) >= loginFailureInterval {
		t.swept = now
		for a, l := range t.clients { // a full bucket is a fresh one: forget it
			if l.TokensAt(now) >= loginFailuresBurst {
				delete(t.clients, a)
			}
		}
	}
	if len(t.clients) >= loginClientsMax {
		addr = overflow
		if l, ok := t.clients[addr]; ok {
			return l
		}
	}
	l := rate.NewLimiter(rate.Every(loginFailureInterval), loginFailuresBurst)
	t.clients[addr] = l
	return l
}

// wait is how long addr must wait before its next sign-in is checked; 0:
// now.
func (t *throttle) wait(addr string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.clients[addr]
	if !ok && len(t.clients) >= loginClientsMax {
		l, ok = t.clients[overflow]
	}
	if !ok {
		return 0
	}
	if missing := 1 - l.TokensAt(now); missing > 0 {
		return time.Duration(math.Ceil(missing * float64(loginFailureInterval)))
	}
	return 0
}

// fail records a failed sign-in from addr and returns how many it has
// left before it is throttled.
func (t *throttle) fail(addr string, now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.limiter(addr, now)
	l.AllowN(now, 1)
	return max(int(l.TokensAt(now)), 0)
}

// len is how many addresses the throttle remembers.
func (t *throttle) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.clients)
}

// throttled answers 429 when r's address has failed too often; true when
// it did. The token r carries is not checked then.
func (c *Console) throttled(w http.ResponseWriter, r *http.Request) bool {
	addr := clientOf(r)
	d := c.logins.wait(addr, c.cfg.Clock.Now())
	if d <= 0 {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	http.Error(w, fmt.Sprintf("refused: too many failed sign-ins from your address; try again in %s", d.Round(time.Second).String()), http.StatusTooManyRequests)
	return true
}

// failed records and logs a failed sign-in — never the token tried. The
// refusals of a throttled address are not logged one by one: the line that
// throttles it says so.
func (c *Console) failed(r *http.Request, via string) {
	addr := clientOf(r)
	left := c.logins.fail(addr, c.cfg.Clock.Now())
	msg := "Console sign-in failed: wrong token"
	if left == 0 {
		msg = "Console sign-in failed: wrong token; this address is now throttled (one sign-in checked per " + loginFailureInterval.String() + ", the rest refused with 429 unchecked)"
	}
	c.cfg.Logger.Info(msg, watermill.LogFields{"client": diag.Printable(addr, 64), "via": via, "left_before_throttle": left})
}
