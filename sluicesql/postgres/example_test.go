package postgres_test

import (
	"fmt"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

// The pool of docs/deduplication.md ("A store that hangs"): the DSN as it
// is, capped to what the handlers hold at once.
func ExampleOpen() {
	dsn := testenv.PostgresURL
	prefetch, consumers := 16, 1
	db, err := postgres.Open(postgres.Config{DSN: dsn}) // lib/pq; the DSN as it is
	db.SetMaxOpenConns(prefetch*consumers + 4)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = db.Close() }()
	fmt.Println(db.Ping() == nil)
	// Output: true
}
