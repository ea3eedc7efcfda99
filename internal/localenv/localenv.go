// Package localenv holds the addresses of the services on a development or
// CI machine (see make services) and the environment lookup that overrides
// them, for the tests, the benchmarks, the chaos harness and the CLI.
package localenv

import "os"

// The local services, as make services provides them.
const (
	PostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	AMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	RedisAddr   = "127.0.0.1:6379"
	MariaDBDSN  = "root@tcp(127.0.0.1:3306)/test"
)

// Get returns the environment variable name, or def when it is unset or empty.
func Get(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
