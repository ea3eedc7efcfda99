package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// Issue 43, item 6: the failed sign-in throttle remembers at most
// LoginClientsMax addresses (and the allowance the others share past it),
// however many fail.
func TestTheSignInThrottleIsBounded(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Dial: func() (*amqp.Connection, error) { return nil, fmt.Errorf("no broker here") }, ReadOnly: true,
		Token: "0123456789abcdef", Logger: watermill.NopLogger{}})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	signIn := func(addr string) int {
		r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {"wrong"}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		return w.Code
	}
	for i := range 2 * LoginClientsMax {
		require.Equal(t, http.StatusUnauthorized, signIn(fmt.Sprintf("10.%d.%d.%d:4000", i>>16, i>>8&0xff, i&0xff)))
	}
	require.LessOrEqual(t, c.logins.len(), LoginClientsMax+1, "the known addresses and the shared allowance")
}
