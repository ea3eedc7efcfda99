package console

import (
	"bufio"
	"cmp"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
)

type auditRow struct {
	Time                                             time.Time
	Operator, Command, Queue, Outcome, Error, Reason string
	Filters                                          string
	Count                                            int
}

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	rows, err := readAudit(c.cfg.AuditFile)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.render(w, r, "audit", rows)
}

// readAudit reads the last lines of the audit log, newest first.
func readAudit(path string) ([]auditRow, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, diag.RedactError(err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(0, st.Size()-auditTail)
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), auditTail)
	var rows []auditRow
	first := off > 0
	for sc.Scan() {
		if first { // a line cut by the seek
			first = false
			continue
		}
		var rec dlq.AuditRecord
		if rec.UnmarshalJSON(sc.Bytes()) != nil {
			continue
		}
		var fs []string
		for _, k := range slices.Sorted(maps.Keys(rec.Filters)) {
			fs = append(fs, k+"="+rec.Filters[k])
		}
		rows = append(rows, auditRow{Time: rec.Time, Operator: diag.Printable(rec.Operator, textMax), Command: diag.Printable(rec.Command, 64),
			Queue: diag.Printable(rec.Queue, 255), Outcome: diag.Printable(rec.Outcome, 32), Error: diag.Printable(rec.Error, textMax),
			Reason: diag.Printable(rec.Reason, textMax), Filters: diag.Printable(strings.Join(fs, " "), textMax),
			Count: cmp.Or(rec.Result.Replayed, rec.Result.Selected)})
	}
	slices.Reverse(rows)
	return rows[:min(len(rows), auditMax)], nil
}
