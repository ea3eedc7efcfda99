// Package sqlname checks and quotes the table names the SQL stores are
// given: each part an unquoted SQL identifier, so a name can never carry SQL.
package sqlname

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
)

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Quote checks table — name, or schema.name when schemas — and returns it
// quoted ("schema"."name") and its last part unquoted.
func Quote(table string, schemas bool) (quoted, name string, err error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 || len(parts) == 2 && !schemas {
		return "", "", fmt.Errorf("table %q: want name or schema.name (schema.name on PostgreSQL only)", table)
	}
	for i, p := range parts {
		if !identifier.MatchString(p) {
			return "", "", fmt.Errorf("table %q: %q is not an SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)", table, p)
		}
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, "."), parts[len(parts)-1][1 : len(parts[len(parts)-1])-1], nil
}

// Index names an index of table: table+suffix, or, when that would pass
// PostgreSQL's 63-byte identifiers (which it would silently truncate,
// possibly to the table's own name), the table name cut short with a hash
// of the whole name and tag ("<cut>_<fnv32a>_<tag>").
func Index(table, suffix, tag string) string {
	if len(table)+len(suffix) <= 63 {
		return table + suffix
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(table))
	tail := fmt.Sprintf("_%08x_%s", h.Sum32(), tag)
	return table[:63-len(tail)] + tail
}
