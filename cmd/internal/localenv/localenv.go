// Package localenv holds the addresses of the services on a development or
// CI machine (see make services), the defaults of the CLI's, the bench's
// and the chaos harness's flags, and the environment lookup that overrides
// them. The library's tests have their own (internal/localenv of the root
// module): the cmd module builds against a release of the library, whose
// internal packages are not its API.
package localenv

import "os"

// The local services, as make services provides them.
const (
	PostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	AMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

// Get returns the environment variable name, or def when it is unset or
// empty.
func Get(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
