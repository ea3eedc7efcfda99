// Package sqldb turns a plain *sql.DB into the *sqlx.DB the SQL stores run
// on, naming its dialect from its driver.
package sqldb

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// drivers are the database/sql drivers the stores know, by the Go type of
// their driver.Driver, and the driver name sqlx (and the stores' dialects)
// know them by.
var drivers = map[string]string{
	"*pq.Driver":            "postgres", // github.com/lib/pq
	"postgres.Driver":       "postgres", // lib/pq through sluicesql/postgres.Open
	"*stdlib.Driver":        "pgx",      // github.com/jackc/pgx/v5/stdlib, also stdlib.OpenDBFromPool
	"*sqlite.Driver":        "sqlite",   // modernc.org/sqlite
	"*sqlite3.SQLiteDriver": "sqlite3",  // github.com/mattn/go-sqlite3
}

// Open returns the *sqlx.DB of exactly one of db and plain: db itself, or
// plain wrapped with driverName, else with the name of its driver's type
// (lib/pq, pgx's stdlib, modernc.org/sqlite, mattn/go-sqlite3). what names
// the configuration in errors ("sqlstore: Config").
func Open(what string, db *sqlx.DB, plain *sql.DB, driverName string) (*sqlx.DB, error) {
	switch {
	case db != nil && plain != nil:
		return nil, fmt.Errorf("%s: give DB or SQLDB, not both", what)
	case db != nil:
		if driverName != "" {
			return nil, fmt.Errorf("%s.DriverName: only with SQLDB (DB's driver name is its own)", what)
		}
		return db, nil
	case plain == nil:
		return nil, errors.New(what + ".DB is required (or SQLDB, a *sql.DB)")
	}
	if driverName == "" {
		t := fmt.Sprintf("%T", plain.Driver())
		name, ok := drivers[t]
		if !ok {
			return nil, fmt.Errorf("%s.SQLDB: its driver %s is not one Sluice knows the dialect of: set %s.DriverName (postgres, pgx, sqlite or sqlite3)", what, t, what)
		}
		driverName = name
	}
	return sqlx.NewDb(plain, driverName), nil
}

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
