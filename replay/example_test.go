package replay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

// A message replayed by `sluice dlq replay` carries its run and item; the
// stage records what became of it — here, poisoned again — where `sluice dlq
// report` reads it. In a stack, give router.Stages.Replay the Config.
func Example() {
	dir, _ := os.MkdirTemp("", "replay-example")
	defer func() { _ = os.RemoveAll(dir) }()
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "outcomes.db"))
	if err != nil {
		panic(err)
	}
	defer func() { _ = db.Close() }()
	store, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{})
	if err != nil {
		panic(err)
	}
	if err := store.CreateTable(context.Background()); err != nil {
		panic(err)
	}
	stage, err := replay.New(replay.Config{Store: store})
	if err != nil {
		panic(err)
	}
	handler := stage(func(msg *message.Message) ([]*message.Message, error) {
		sluice.Record(msg.Context(), func(r *sluice.Report) { // what the poison stage records
			r.Outcome, r.Class, r.Reason = sluice.OutcomePoisoned, sluice.ClassPoison, "unknown schema version 3"
		})
		return nil, nil
	})
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(replay.RunKey, "run-1")
	msg.Metadata.Set(replay.ItemKey, "o-1005")
	if _, err := handler(msg); err != nil {
		panic(err)
	}
	rs, _ := store.Outcomes(context.Background(), "run-1")
	for _, r := range rs {
		fmt.Println(r.Run, r.Item, r.Outcome, r.Class, r.Reason, ledger.Final(r.Outcome))
	}
	// Output:
	// run-1 o-1005 poisoned poison unknown schema version 3 true
}
