package sluice_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/sluicemq/sluice"

// deps returns the packages pkg depends on (go list -deps), itself included.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.Fields(string(out))
}

// The dependency graph reads bottom-up: the vocabulary at the root, stages
// that import no broker client and no database driver, stores and brokers at
// the edges. A user importing the PostgreSQL path links neither SQLite nor
// Redis.
func TestDependencyGraph(t *testing.T) {
	t.Parallel()
	brokers := []string{"github.com/rabbitmq/amqp091-go", "github.com/ThreeDotsLabs/watermill-amqp"}
	drivers := []string{"modernc.org/sqlite", "github.com/redis/go-redis", "github.com/lib/pq", "github.com/jackc/pgx", "github.com/go-sql-driver/mysql"}
	for _, tt := range []struct {
		pkg       string
		forbidden []string
	}{
		{module, append(append([]string{module + "/"}, brokers...), drivers...)},
		{module + "/middleware", append(append([]string{module + "/deduplication", module + "/retrytiers", module + "/poison", module + "/router"}, brokers...), drivers...)},
		{module + "/deduplication", append(append([]string{module + "/middleware", module + "/retrytiers", module + "/poison"}, brokers...), drivers...)},
		{module + "/retrytiers", append(append([]string{module + "/deduplication", module + "/poison", module + "/router"}, brokers...), drivers...)},
		{module + "/brake", append(append([]string{module + "/deduplication", module + "/retrytiers", module + "/poison", module + "/middleware", module + "/router"}, brokers...), drivers...)},
		{module + "/replay", append(append([]string{module + "/deduplication", module + "/retrytiers", module + "/poison", module + "/middleware", module + "/router", module + "/brake"}, brokers...), drivers...)},
		{module + "/poison", append(append([]string{module + "/deduplication", module + "/retrytiers", module + "/router"}, brokers...), drivers...)},
		{module + "/deduplication/sqlstore", append([]string{"modernc.org/sqlite", "github.com/redis/go-redis"}, brokers...)},
		{module + "/router", append(append([]string{module + "/rabbitmq"}, brokers...), drivers...)},
		{module + "/deduplication/redisstore", append([]string{"modernc.org/sqlite", "github.com/lib/pq"}, brokers...)},
		{module + "/replay/redisstore", append([]string{"modernc.org/sqlite", "github.com/lib/pq", module + "/deduplication", module + "/retrytiers", module + "/poison", module + "/router"}, brokers...)},
	} {
		for _, d := range deps(t, tt.pkg) {
			for _, f := range tt.forbidden {
				if tt.pkg == module && d == module {
					continue
				}
				require.False(t, d == f || strings.HasPrefix(d, f+"/") || strings.HasPrefix(d, f) && strings.HasSuffix(f, "/"),
					"%s must not depend on %s (it does on %s)", tt.pkg, f, d)
			}
		}
	}
}

// A broker package owns its naming and reaches the stages' types through
// router only: rabbitmq imports router, never retrytiers directly.
func TestBrokerPackagesImportRouterNotTheStages(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+"/rabbitmq").CombinedOutput()
	require.NoError(t, err, "%s", out)
	imports := strings.Fields(string(out))
	require.Contains(t, imports, module+"/router")
	for _, stage := range []string{"/retrytiers", "/poison", "/deduplication", "/middleware", "/brake", "/replay"} {
		require.NotContains(t, imports, module+stage)
	}
}
