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
	brokers := []string{"github.com/rabbitmq/amqp091-go", "github.com/sluicemq/sluice/internal/amqpframe", "github.com/ThreeDotsLabs/watermill-amqp"}
	drivers := []string{"modernc.org/sqlite", "github.com/redis/go-redis", "github.com/lib/pq", "github.com/jackc/pgx", "github.com/go-sql-driver/mysql"}
	for _, tt := range []struct {
		pkg       string
		forbidden []string
	}{
		{module, append(append([]string{module + "/"}, brokers...), drivers...)},
		{module + "/stage", append(append([]string{module + "/deduplication", module + "/retrytiers", module + "/poison", module + "/router"}, brokers...), drivers...)},
		{module + "/deduplication", append(append([]string{module + "/stage", module + "/retrytiers", module + "/poison"}, brokers...), drivers...)},
		{module + "/retrytiers", append(append([]string{module + "/deduplication", module + "/poison", module + "/router"}, brokers...), drivers...)},
		{module + "/brake", append(append([]string{module + "/deduplication", module + "/retrytiers", module + "/poison", module + "/stage", module + "/router"}, brokers...), drivers...)},
		{module + "/replay", append(append([]string{"github.com/jmoiron/sqlx", module + "/deduplication", module + "/retrytiers", module + "/poison", module + "/stage", module + "/router", module + "/brake"}, brokers...), drivers...)},
		{module + "/poison", append(append([]string{module + "/deduplication", module + "/retrytiers", module + "/router"}, brokers...), drivers...)},
		// The unit of work links no stage, no store and no driver.
		{module + "/unitofwork", append(append([]string{module + "/deduplication", module + "/outbox", module + "/router", "github.com/jmoiron/sqlx"}, brokers...), drivers...)},
		{module + "/router", append(append([]string{module + "/rabbitmq", module + "/embedded"}, brokers...), drivers...)},
		{module + "/embedded", append(brokers, drivers...)},
		{module + "/outbox", append(append([]string{"github.com/jmoiron/sqlx", module + "/router", module + "/retrytiers", module + "/poison", module + "/stage", module + "/brake", module + "/replay"}, brokers...), drivers...)},
		{module + "/sluicesql", append([]string{"modernc.org/sqlite", "github.com/redis/go-redis", "github.com/lib/pq", "github.com/jackc/pgx", module + "/router"}, brokers...)},
		// The one package that imports lib/pq: a bounded PostgreSQL pool.
		{module + "/sluicesql/postgres", append([]string{"modernc.org/sqlite", "github.com/redis/go-redis", "github.com/jackc/pgx", "github.com/go-sql-driver/mysql", module + "/router", module + "/deduplication", module + "/outbox"}, brokers...)},
		{module + "/service", append(append([]string{module + "/rabbitmq", module + "/embedded", "github.com/prometheus/client_golang", "go.opentelemetry.io/otel/exporters/prometheus"}, brokers...), drivers...)},
		// The test kit links SQLite, its default database, and no network client.
		{module + "/sluicetest", append([]string{module + "/rabbitmq", "github.com/redis/go-redis", "github.com/lib/pq", "github.com/jackc/pgx", "github.com/go-sql-driver/mysql", "github.com/prometheus/client_golang"}, brokers...)},
		{module + "/promexport", append(append([]string{module + "/router", module + "/service", module + "/deduplication", module + "/outbox"}, brokers...), drivers...)},
		{module + "/sluiceredis", append([]string{"modernc.org/sqlite", "github.com/lib/pq", "github.com/jackc/pgx", "github.com/jmoiron/sqlx", module + "/retrytiers", module + "/poison", module + "/router"}, brokers...)},
	} {
		for _, d := range deps(t, tt.pkg) {
			for _, f := range tt.forbidden {
				if tt.pkg == module && (d == module || rootLeaf(t, d)) {
					continue
				}
				require.False(t, d == f || strings.HasPrefix(d, f+"/") || strings.HasPrefix(d, f) && strings.HasSuffix(f, "/"),
					"%s must not depend on %s (it does on %s)", tt.pkg, f, d)
			}
		}
	}
}

// rootLeaf reports whether d is one of the internal packages the root may
// import (the SQLSTATE reader, the metadata keys its stages share): under
// internal/ and importing no package of the module itself, so the root
// still links nothing else of Sluice's.
func rootLeaf(t *testing.T, d string) bool {
	if !strings.HasPrefix(d, module+"/internal/") {
		return false
	}
	for _, dd := range deps(t, d) {
		if dd != d && strings.HasPrefix(dd, module) {
			return false
		}
	}
	return true
}

// The broker contract imports the root package only (and internal
// plumbing); a broker package imports the contract and no stage, no store
// and not router, so a new broker is a new package at the edge.
func TestBrokersDependOnTheContractOnly(t *testing.T) {
	t.Parallel()
	for _, d := range deps(t, module+"/broker") {
		if strings.HasPrefix(d, module) {
			require.True(t, d == module || d == module+"/broker" || strings.HasPrefix(d, module+"/internal/"),
				"the broker contract must import only the root and internal plumbing (it imports %s)", d)
		}
	}
	stages := []string{"/router", "/retrytiers", "/poison", "/deduplication", "/stage", "/brake", "/replay"}
	for _, pkg := range []string{module + "/rabbitmq", module + "/embedded"} {
		imports := deps(t, pkg)
		require.Contains(t, imports, module+"/broker", "%s implements the contract", pkg)
		for _, d := range imports {
			for _, stage := range stages {
				require.False(t, d == module+stage || strings.HasPrefix(d, module+stage+"/"), "%s must not depend on %s (it does on %s)", pkg, module+stage, d)
			}
			require.False(t, strings.HasPrefix(d, "github.com/jmoiron/sqlx"), "%s must not link sqlx", pkg)
		}
	}
}
