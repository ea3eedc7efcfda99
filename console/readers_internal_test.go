package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// One reader of a poison queue at a time: a page that finds the queue
// taken by another page, action or run of this console waits for it at
// most Config.CallTimeout (which was ReadWait), then answers 503 with
// ErrQueueBusy; once the queue is given back, a page reads it again.
func TestAPageWaitsForTheQueueAtMostCallTimeout(t *testing.T) {
	t.Parallel()
	dials := 0
	c, err := New(Config{Dial: func() (*amqp.Connection, error) { dials++; return nil, fmt.Errorf("no broker here") }, ReadOnly: true,
		Queues: []Queue{{Name: "orders", Poison: "orders.poison"}}, CallTimeout: 300 * time.Millisecond, SampleInterval: -1})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	get := func() (int, string) {
		w := httptest.NewRecorder()
		c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/q/orders.poison/g/g1", nil))
		return w.Code, w.Body.String()
	}

	release, err := c.reading(t.Context(), "orders.poison", time.Second)
	require.NoError(t, err)
	start := time.Now()
	code, body := get()
	took := time.Since(start)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "another page, action or replay run of this console is reading this poison queue")
	require.GreaterOrEqual(t, took, 300*time.Millisecond, "it waited its CallTimeout")
	require.Less(t, took, 10*time.Second, "and no longer")
	require.Zero(t, dials, "it never read the queue")

	release()
	code, body = get()
	require.Equal(t, http.StatusBadGateway, code, body) // the queue is free: the page dials (and finds no broker here)
	require.Equal(t, 1, dials)
}
