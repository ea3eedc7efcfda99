// Package sqldb holds what the SQL stores and dlq share about sending
// values to PostgreSQL without a driver's types.
package sqldb

import (
	"strings"
)

// TextArray is ss as a PostgreSQL text[] literal ({"a","b\\"c"}): each
// element double-quoted, its backslashes and double quotes escaped. Sent as
// a text parameter and cast in the query (CAST($1 AS TEXT)::TEXT[]), or
// inlined, an array needs no driver's type (lib/pq's pq.Array). ss must
// hold no NUL byte, which PostgreSQL's text refuses.
func TextArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
