package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
)

// Issue 43, item 6: the failed sign-in throttle remembers at most
// loginClientsMax addresses (and the allowance the others share past it),
// however many fail. On a stopped clock: the test once passed only when its
// 20,000 sign-ins took longer than loginFailureInterval (under the race
// detector on a loaded machine), and failed on a fast one with 429 where it
// wanted 401 — the shared allowance doing what it is for.
func TestTheSignInThrottleIsBounded(t *testing.T) {
	t.Parallel()
	clock := testenv.NewStoppedClock(time.Now())
	c, err := New(Config{Dial: func() (*amqp.Connection, error) { return nil, fmt.Errorf("no broker here") }, ReadOnly: true,
		Token: "0123456789abcdef", Env: sluice.Env{Logger: watermill.NopLogger{}, Clock: clock}})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	signIn := func(i int) int {
		r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {"wrong"}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:4000", i>>16, i>>8&0xff, i&0xff)
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		return w.Code
	}
	next := 0 // the next address never seen
	for range loginClientsMax {
		require.Equal(t, http.StatusUnauthorized, signIn(next), "address %d: remembered, its own allowance", next)
		next++
	}
	for range loginFailuresBurst {
		require.Equal(t, http.StatusUnauthorized, signIn(next), "address %d: past the bound, the shared allowance", next)
		next++
	}
	require.Equal(t, http.StatusTooManyRequests, signIn(next), "the shared allowance spent")
	next++
	require.Equal(t, loginClientsMax+1, c.logins.len(), "the known addresses and the shared allowance")

	// Once loginFailureInterval has passed, the remembered addresses'
	// allowances are whole again and forgotten: new addresses are
	// remembered again, each with its own.
	clock.Advance(loginFailureInterval)
	for range loginClientsMax - 1 {
		require.Equal(t, http.StatusUnauthorized, signIn(next), "address %d, after the interval", next)
		next++
	}
	require.LessOrEqual(t, c.logins.len(), loginClientsMax+1, "still bounded")
}
