package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/signing"
	"github.com/sluicemq/sluice/stage"
)

// A deployment with a key: the consumers' stages and `sluice dlq replay
// --signing-key-file` share it. The replay's copies are signed, so the
// consumers believe their run and record every outcome; a message in the
// poison queue whose diagnosis is not signed (a producer's, dead-lettered
// by the broker, naming another service's queue) is not replayed there.
func TestSignedReplayRecordsOutcomesAndRefusesAForgedTarget(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	keyFile := filepath.Join(t.TempDir(), "sluice.key")
	require.NoError(t, os.WriteFile(keyFile, []byte("7d1f0c3b9a8e4f2d6c5b4a39281706f5e4d3c2b1a0998877\n"), 0o600))
	signer, err := signing.NewFromFile(keyFile)
	require.NoError(t, err)

	mw, err := poison.New(poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue, Env: sluice.Env{Signer: signer}})
	require.NoError(t, err)
	for i := range 3 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("good-", i))
		_, err := mw(func(*message.Message) ([]*message.Message, error) {
			return nil, sluice.NewFailure(sluice.ClassExhausted, errors.New("stock service: timeout"))
		})(m)
		require.NoError(t, err)
	}

	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	table := schema + ".sluice_replay"
	sub, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Name: "stock", Topic: b.topo.Config().Queue, Subscriber: sub, Handler: func(*message.Message) error { return nil },
		Stages: router.Stages{
			Replay:   &replay.Config{Store: testenv.OutcomeStore(t, db, table), Env: sluice.Env{Signer: signer}},
			Poison:   &poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue, Env: sluice.Env{Signer: signer}},
			Retry:    &retrytiers.Config{Publisher: b.pub, Tiers: b.topo.Tiers(), Env: sluice.Env{Signer: signer}},
			Classify: &stage.ClassifyConfig{},
			Inbox:    &deduplication.Config{Store: testenv.SQLStore(t, db, schema+".inbox"), Consumer: "stock"},
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })

	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "1", "--ramp", "2",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", table, "--wait", outcomeWait, "--signing-key-file", keyFile)
	require.Equal(t, 0, code, "every signed replay has its outcome: %s\n%s", out, errOut)
	require.Contains(t, out, "batch 1 (canary, 1): 1 replayed, 1 with a final outcome, 0 poisoned again")
	code, report, errOut := b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, report, ": 3 processed")

	// A producer's message in the poison queue (as the broker dead-letters
	// one past a quorum queue's delivery limit) naming another queue.
	other := testenv.Name("other-service")
	ch := testenv.Channel(t, testenv.AMQP(t))
	_, err = ch.QueueDeclare(other, true, false, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, other)
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", b.topo.Config().PoisonQueue, true, false, amqp.Publishing{Headers: amqp.Table{
		sluice.EventIDKey: "forged", metakeys.PoisonClass: "poison", metakeys.PoisonReason: "forged", metakeys.PoisonQueue: other,
	}, Body: []byte(`{}`)}))
	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--signing-key-file", keyFile)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "its diagnosis is not signed")
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), other), "nothing reached the other service's queue")
	require.Equal(t, []string{"forged"}, peekIDs(t, b.topo.Config().PoisonQueue), "it stays in the poison queue")
}

// Issue 28, item 12: `sluice dlq replay --signing-key-file` signs each copy
// for the queue it replays it to, so its run and item are believed there
// and on no other queue. A poison copy signed before signatures named their
// queue (v1) is still replayed to the queue it names.
func TestReplaySignsForTheTargetQueue(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	key := []byte("7d1f0c3b9a8e4f2d6c5b4a39281706f5e4d3c2b1a0998877")
	keyFile := filepath.Join(t.TempDir(), "sluice.key")
	require.NoError(t, os.WriteFile(keyFile, append(key, '\n'), 0o600))
	signer, err := signing.NewFromFile(keyFile)
	require.NoError(t, err)

	mw, err := poison.New(poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue, Env: sluice.Env{Signer: signer}})
	require.NoError(t, err)
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "poisoned-now")
	_, err = mw(func(*message.Message) ([]*message.Message, error) {
		return nil, sluice.NewFailure(sluice.ClassExhausted, errors.New("stock service: timeout"))
	})(m)
	require.NoError(t, err)
	old := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	old.Metadata.Set(sluice.EventIDKey, "poisoned-before")
	old.Metadata.Set(metakeys.PoisonClass, "exhausted")
	old.Metadata.Set(metakeys.PoisonReason, "stock service: timeout")
	old.Metadata.Set(metakeys.PoisonQueue, b.topo.Config().Queue)
	testenv.SignV1(key, old)
	require.NoError(t, b.pub.Publish(b.topo.Config().PoisonQueue, old))

	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--signing-key-file", keyFile)
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	ms, err := dlq.Open(testenv.AMQP(t), b.topo.Config().Queue, dlq.Config{}).Inspect(t.Context(), dlq.Filter{}, 0)
	require.NoError(t, err)
	require.Len(t, ms, 2, "both replayed to the queue they name")
	for _, m := range ms {
		require.NoError(t, signer.Verify(m.Msg, b.topo.Config().Queue), "%s: signed for the queue it was replayed to", m.EventID)
		require.ErrorIs(t, signer.Verify(m.Msg, b.topo.Config().Queue+"-other"), signing.ErrBadSignature, "%s: and no other", m.EventID)
	}
}
