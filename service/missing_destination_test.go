package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicesql"
)

// A produced event whose destination does not exist waits, and what the
// log and the row say names the missing queue and the command that
// declares it — on RabbitMQ and PostgreSQL. Before, both said only
// "message returned as unroutable: exchange (default exchange), routing
// key "…": 312 NO_ROUTE".
func TestAMissingDestinationIsNamedWithItsCommand(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	q, produced := rabbit(t) // produced is not declared
	log := testenv.NewLog()
	r := newRouter(t, log)
	svc := newService(t, service.Config{DB: db, Schema: testenv.Schema(t, db), Router: r, Publisher: q.Publisher()})
	require.NoError(t, svc.Add(service.Handler{Broker: q, Name: "orders", PublishTopic: produced, PublishingHandler: produceOne}))
	run(t, r, svc)
	testenv.PublishEvents(t, q.Publisher(), q.Topology().Config().Queue, 1)

	const logged = "Outbox rows could not be published"
	require.Eventually(t, func() bool { return len(log.Lines(logged)) > 0 }, 2*time.Minute, 10*time.Millisecond)
	want := []string{fmt.Sprintf("no queue named %q exists", produced), "`sluice topology apply --queue " + produced + "`", "312 NO_ROUTE"}
	line := log.Lines(logged)[0].Text()
	for _, w := range want {
		require.Contains(t, line, w)
	}
	require.Empty(t, log.Lines("has no stage outside it"), "the short path's Classify has the poison and retry stages outside it")
	require.Empty(t, log.Lines("without Sluice's rabbitmq.Marshaler"))
	rows, err := svc.Stores().Outbox.List(t.Context(), sluicesql.OutboxFailing, 10)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	for _, w := range want {
		require.True(t, strings.Contains(rows[0].LastError, w), "the row's last error (sluice outbox list, the console) says %q: %s", w, rows[0].LastError)
	}
}
