package dlq

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/sluicemq/sluice/internal/diag"
)

// AuditRecord is one line of the audit log: who ran what, on what, and how
// it ended.
type AuditRecord struct {
	Time     time.Time         `json:"time"`
	Operator string            `json:"operator"`
	Command  string            `json:"command"`
	Queue    string            `json:"queue"`
	Filters  map[string]string `json:"filters"`
	Options  map[string]string `json:"options,omitempty"`
	Result   Result            `json:"result"`
	Outcome  string            `json:"outcome"` // "ok", "dry-run" or "error"
	Error    string            `json:"error,omitempty"`
	// Reason is why the operator did it (discard requires one).
	Reason string `json:"reason,omitempty"`
	// Items are the messages a discard removed (event id, else message id).
	Items []string `json:"items,omitempty"`
}

// countKey is the name, in an audit line's "result", of the count of
// messages the command moved: what it did to them.
func countKey(command string) string {
	switch command {
	case "dlq archive":
		return "archived"
	case "dlq restore":
		return "restored"
	case "dlq discard", "outbox discard":
		return "discarded"
	case "outbox requeue":
		return "requeued"
	case "order skip":
		return "skipped"
	case "dlq resolve":
		return "compensated"
	case "topology migrate":
		return "moved"
	}
	return "replayed"
}

// auditFields is AuditRecord without its JSON methods; in an audit line
// its result is a map, in which the count of what the command did
// (Result.Replayed) is named for it ("discarded": 4), not "replayed"
// whatever the command.
type auditFields AuditRecord

// MarshalJSON writes the record with its count named for the command.
func (r AuditRecord) MarshalJSON() ([]byte, error) {
	res := map[string]any{"scanned": r.Result.Scanned, "selected": r.Result.Selected, countKey(r.Command): r.Result.Replayed, "by_target": r.Result.ByTarget}
	if len(r.Result.Plan) > 0 {
		res["plan"] = r.Result.Plan
	}
	return json.Marshal(struct {
		auditFields
		Result map[string]any `json:"result"`
	}{auditFields(r), res})
}

// UnmarshalJSON reads a line MarshalJSON wrote (and the lines before it,
// whose count was "replayed" for every command).
func (r *AuditRecord) UnmarshalJSON(b []byte) error {
	raw := struct {
		*auditFields
		Result map[string]json.RawMessage `json:"result"`
	}{auditFields: (*auditFields)(r)}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	r.Result = Result{}
	for key, dst := range map[string]any{"scanned": &r.Result.Scanned, "selected": &r.Result.Selected, "by_target": &r.Result.ByTarget,
		"plan": &r.Result.Plan, "replayed": &r.Result.Replayed, countKey(r.Command): &r.Result.Replayed} {
		if v, ok := raw.Result[key]; ok {
			if err := json.Unmarshal(v, dst); err != nil {
				return fmt.Errorf("audit record's result.%s: %w", key, err)
			}
		}
	}
	return nil
}

// CheckAudit opens the audit log at path for appending (creating it) and
// closes it: what moves messages checks it can record them before anything
// moves. "-" (stdout) always passes.
func CheckAudit(path string) error {
	if path == "-" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("dlq: the audit log cannot be written, nothing was moved: %w", err)
	}
	return f.Close()
}

// AppendAudit appends rec as a JSON line to path (synced to disk), or
// writes it to stdout when path is "-".
func AppendAudit(path string, rec AuditRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	b = append(diag.EscapeJSON(b), '\n') // event ids and errors are message contents
	if path == "-" {
		_, err := os.Stdout.Write(b)
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("dlq: opening the audit log: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
