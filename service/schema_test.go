package service_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/service"
)

// On PostgreSQL the schema of Sluice's tables is a decision of the short
// path: service.New refuses a Config without one, saying why, and Migrate
// creates the one named. Two services sharing a database, each with a
// handler named "inventory", then keep their inboxes apart: one event id
// runs once in each. Before, New took the connection's search_path (both
// services' tables in public, the second service's event acked as a
// duplicate of the first's), and Migrate failed on a schema not created
// beforehand.
func TestTwoServicesOnOneDatabaseEachHaveTheirSchema(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	_, err := service.New(service.Config{DB: db, Router: newRouter(t, watermill.NopLogger{})})
	require.ErrorContains(t, err, "Config.Schema is required on PostgreSQL")
	require.ErrorContains(t, err, `Schema: "public" keeps the tables in the default schema`)

	var ran [2]atomic.Int64
	for i, schema := range []string{testenv.Name("svc_a"), testenv.Name("svc_b")} {
		dropSchemaNowAndAtEnd(t, db, schema) // Migrate creates it
		e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Hour}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		r := newRouter(t, watermill.NopLogger{})
		svc := newService(t, service.Config{DB: db, Schema: schema, Router: r})
		require.NoError(t, svc.Add(service.Handler{Broker: e, Name: "inventory", Handler: func(*message.Message) error {
			ran[i].Add(1)
			return nil
		}}))
		run(t, r, svc)
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, "evt-1")
		require.NoError(t, e.PubSub().Publish("orders", m))
		require.Eventually(t, func() bool {
			var claims int
			require.NoError(t, db.GetContext(t.Context(), &claims, `SELECT count(*) FROM `+schema+`.sluice_inbox`))
			return claims == 1
		}, 2*time.Minute, 10*time.Millisecond, "service %d commits evt-1 in its own schema's inbox", i)
		require.Equal(t, int64(1), ran[i].Load(), "service %d ran evt-1, not a duplicate of the other's", i)
	}
}
