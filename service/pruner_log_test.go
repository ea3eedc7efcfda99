package service_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/service"
)

// A pruner whose run fails says which records it prunes: on PostgreSQL
// with Sluice's tables not created (no Migrate), the inbox's pruner names
// the inbox and sluice_inbox, the replay outcomes' names the replay
// outcomes and sluice_replay. Before, both lines began "Pruning the inbox
// failed", the second one over an error naming sluice_replay.
func TestAFailedPruneNamesWhatItPrunes(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	log := testenv.NewLog()
	r := newRouter(t, log)
	svc, err := service.New(service.Config{DB: db, Schema: testenv.Schema(t, db), Router: r, PruneInterval: time.Hour})
	require.NoError(t, err)
	require.NoError(t, svc.Add(service.Handler{Broker: e, Name: "orders", Handler: func(*message.Message) error { return nil }}))
	run(t, r, svc)
	require.Eventually(t, func() bool { return len(log.Lines("Pruning")) == 2 }, 2*time.Minute, 10*time.Millisecond,
		"both pruners fail once: the tables are missing")
	byMsg := map[string]string{}
	for _, l := range log.Lines("Pruning") {
		byMsg[l.Msg] = l.Err.Error()
	}
	require.Contains(t, byMsg, "Pruning the inbox failed")
	require.Contains(t, byMsg["Pruning the inbox failed"], "sluice_inbox")
	require.Contains(t, byMsg, "Pruning the replay outcomes failed")
	require.Contains(t, byMsg["Pruning the replay outcomes failed"], "sluice_replay")
}
