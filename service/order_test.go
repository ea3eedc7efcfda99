package service_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/service"
)

// The short path's ordered handler (Handler.OrderBy), on RabbitMQ and
// PostgreSQL: Migrate creates the ordering tables; one account's message
// fails once and goes to the tier, and the account's later messages apply
// after it, in publish order, while another account's flow. On SQLite,
// OrderBy is refused with a reason.
func TestAnOrderedHandlerOnTheShortPath(t *testing.T) {
	t.Parallel()
	q, _ := rabbit(t)
	db := testenv.Postgres(t)
	r := newRouter(t, watermill.NopLogger{})
	svc := newService(t, service.Config{DB: db, Schema: testenv.Schema(t, db), Router: r})
	var mu sync.Mutex
	var applied []string
	failed := false
	require.NoError(t, svc.Add(service.Handler{Broker: q, Name: "ledger", OrderBy: sluice.KeyFromMetadata("account"),
		Handler: func(msg *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			id := msg.Metadata.Get(sluice.EventIDKey)
			if id == "a-1" && !failed {
				failed = true
				return sluice.Transient(errors.New("the ledger service is busy"))
			}
			applied = append(applied, id)
			return nil
		}}))
	run(t, r, svc)
	var want []string
	for i := range 5 {
		for _, acct := range []string{"a", "b"} {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			id := fmt.Sprintf("%s-%d", acct, i)
			m.Metadata.Set(sluice.EventIDKey, id)
			m.Metadata.Set("account", acct)
			require.NoError(t, q.Publisher().Publish(q.Topology().Config().Queue, m))
			want = append(want, id)
		}
	}
	of := func(acct string) []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, id := range applied {
			if id[:1] == acct {
				out = append(out, id)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(of("a")) == 5 && len(of("b")) == 5 }, 2*time.Minute, 10*time.Millisecond)
	require.Equal(t, []string{"a-0", "a-1", "a-2", "a-3", "a-4"}, of("a"), "a-1 went to the tier; a-2..a-4 waited for it")
	require.Equal(t, []string{"b-0", "b-1", "b-2", "b-3", "b-4"}, of("b"))
	require.True(t, failed)

	lite := newService(t, service.Config{DB: testenv.SQLite(t), Router: newRouter(t, watermill.NopLogger{})})
	err := lite.Add(service.Handler{Broker: q, Name: "ledger-lite", OrderBy: sluice.KeyFromMetadata("account"),
		Handler: func(*message.Message) error { return nil }})
	require.ErrorContains(t, err, "the ordering store needs PostgreSQL")
}
