package sluice_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A service that requires Sluice builds every library package with the
// module's own go.mod alone: replace directives in Sluice's go.mod do not
// bind it. Before, the rabbitmq package compiled only against the patched
// AMQP client a replace pointed at: "d.HeadersError undefined (type
// amqp091.Delivery has no field or method HeadersError)".
func TestALibraryUserBuildsTheRabbitMQPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	t.Parallel()
	run := libraryUser(t, `package main

import (
	"fmt"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicesql"
)

func main() {
	fmt.Println(rabbitmq.ErrQueueNotFound, router.Order(), sluicesql.NewInbox != nil, service.New != nil)
}
`)
	run("build", "-o", os.DevNull, ".")
	linked := map[string]bool{}
	for _, m := range strings.Fields(run("list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".")) {
		linked[m] = true
	}
	for _, tool := range []string{"github.com/spf13/cobra", "github.com/jedib0t/go-pretty/v6", "github.com/go-sql-driver/mysql", "modernc.org/sqlite", "github.com/redis/go-redis/v9",
		// Only promexport links them: the service package takes any MeterProvider.
		"github.com/prometheus/client_golang", "go.opentelemetry.io/otel/exporters/prometheus"} {
		require.False(t, linked[tool], "the service links %s, which none of the packages it imports needs", tool)
	}
	t.Logf("the service links %d modules", len(linked))
}

// The operator tools (cmd/) and the examples (examples/) are modules of their
// own, so what only they import stays out of a library user's module graph.
// The root go.mod requires none of it, directly or as // indirect.
func TestTheLibraryModuleRequiresNoToolOnlyModule(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	required := map[string]bool{}
	inBlock := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "require (":
			inBlock = true
		case inBlock && line == ")":
			inBlock = false
		case inBlock && line != "" && !strings.HasPrefix(line, "//"):
			required[strings.Fields(line)[0]] = true
		case strings.HasPrefix(line, "require "):
			required[strings.Fields(line)[1]] = true
		}
	}
	require.Contains(t, required, "github.com/ThreeDotsLabs/watermill", "go.mod read")
	for _, tool := range []string{
		"github.com/spf13/cobra",
		"github.com/spf13/pflag",
		"github.com/jedib0t/go-pretty/v6",
		"github.com/go-sql-driver/mysql",
		"go.opentelemetry.io/otel/exporters/stdout/stdouttrace",
		"github.com/ThreeDotsLabs/watermill-sql/v3",
	} {
		require.False(t, required[tool], "the library's go.mod requires %s, which only cmd/ or examples/ import: it belongs in their go.mod", tool)
	}
	for _, m := range []string{"cmd", "examples"} {
		b, err := os.ReadFile(filepath.Join(m, "go.mod"))
		require.NoError(t, err, "%s/ is a module of its own", m)
		require.Contains(t, string(b), "module github.com/sluicemq/sluice/"+m+"\n")
	}
}
