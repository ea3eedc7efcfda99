package unitofwork_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/unitofwork"
)

// Outside the inbox stage there is no unit of work: the accessors find
// none, the hooks register nothing, and Reentry only calls the handler.
func TestOutsideTheInboxThereIsNoUnitOfWork(t *testing.T) {
	ctx := context.Background()
	if tx := unitofwork.FromContext(ctx); tx != nil {
		t.Fatalf("FromContext = %v, want nil", tx)
	}
	if id := unitofwork.EventID(ctx); id != "" {
		t.Fatalf("EventID = %q, want empty", id)
	}
	if unitofwork.OnCommit(ctx, func() { t.Error("OnCommit's hook ran") }) {
		t.Fatal("OnCommit registered a hook outside the inbox")
	}
	if unitofwork.OnRecordAlone(ctx, func(context.Context, unitofwork.Tx) error { return nil }) {
		t.Fatal("OnRecordAlone registered a write outside the inbox")
	}
	runs := 0
	boom := errors.New("boom")
	h := unitofwork.Reentry(func(*message.Message) ([]*message.Message, error) { runs++; return nil, boom })
	for range 2 {
		if _, err := h(message.NewMessage("1", nil)); !errors.Is(err, boom) || errors.Is(err, unitofwork.ErrHandlerReentered) {
			t.Fatalf("Reentry outside the inbox returned %v, want the handler's error", err)
		}
	}
	if runs != 2 {
		t.Fatalf("the handler ran %d times, want 2", runs)
	}
}
