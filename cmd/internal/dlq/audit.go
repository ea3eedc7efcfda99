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
	Result   ReplayResult      `json:"result"`
	Outcome  string            `json:"outcome"` // "ok", "dry-run" or "error"
	Error    string            `json:"error,omitempty"`
	// Reason is why the operator did it (discard requires one).
	Reason string `json:"reason,omitempty"`
	// Items are the messages a discard removed (event id, else message id).
	Items []string `json:"items,omitempty"`
}

// CheckAudit opens the audit log for appending (creating it) and closes it:
// a run that would move messages checks it can record them first.
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
