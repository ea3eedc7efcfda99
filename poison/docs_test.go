package poison_test

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
)

// documentedKeys returns the header names the diagnosis table of
// docs/poison.md lists, those of its table of the keys set in some cases,
// and those docs/operations.md names.
func documentedKeys(t *testing.T) (table, occasional, runbook []string) {
	t.Helper()
	key := regexp.MustCompile("`(sluice_[a-z_]+)`")
	table = testenv.TableKeys(t, "../docs/poison.md", "| key (AMQP header) | value |", key)
	occasional = testenv.TableKeys(t, "../docs/poison.md", "| key (AMQP header), in some cases | value |", key)
	ops, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	text := string(ops)
	start := strings.Index(text, "carries its diagnosis as headers")
	require.GreaterOrEqual(t, start, 0, "docs/operations.md lists the diagnosis headers")
	end := strings.Index(text[start:], "\n\n")
	for _, m := range key.FindAllStringSubmatch(text[start:start+end], -1) {
		runbook = append(runbook, m[1])
	}
	return table, occasional, runbook
}

// The diagnosis keys are not exported: users read them in docs/poison.md's
// two tables, which must list every key of the diagnosis internal/metakeys
// defines (sluice_poison_*, sluice_poisoned_at), each once, and no other.
func TestTheDocsTablesListEveryDiagnosisKey(t *testing.T) {
	t.Parallel()
	table, occasional, _ := documentedKeys(t)
	var defined []string
	for _, v := range testenv.StringConstants(t, "../internal/metakeys") {
		if strings.HasPrefix(v, metakeys.PoisonPrefix) && v != metakeys.PoisonPrefix {
			defined = append(defined, v)
		}
	}
	var documented []string
	for _, k := range append(table, occasional...) {
		if strings.HasPrefix(k, metakeys.PoisonPrefix) {
			documented = append(documented, k)
		}
	}
	slices.Sort(defined)
	slices.Sort(documented)
	require.Equal(t, defined, documented, "docs/poison.md's tables list the diagnosis keys internal/metakeys defines, each once")
	for _, k := range occasional {
		require.NotContains(t, poison.Diagnosis(), k, "docs/poison.md lists %s as set in some cases; every copy carries it", k)
	}
}

// Every header the docs say a poisoned copy carries, it carries. Before,
// docs/poison.md and docs/operations.md listed sluice_poison_attempts and
// sluice_poison_first_failed_at, which no copy has carried since the copies
// keep the retry stage's own sluice_attempt and sluice_first_failed_at.
func TestThePoisonedCopyCarriesTheDocumentedHeaders(t *testing.T) {
	t.Parallel()
	table, _, runbook := documentedKeys(t)
	require.Equal(t, poison.Diagnosis(), table, "docs/poison.md's diagnosis table lists poison.Diagnosis, in its order")
	for _, k := range runbook {
		require.True(t, slices.Contains(poison.Diagnosis(), k) || k == sluice.EventIDKey || k == sluice.EventTypeKey,
			"docs/operations.md names %s, which is no diagnosis header", k)
	}
	pub := &recorder{}
	mw, err := poison.New(poison.Config{Publisher: pub, Topic: "orders.poison", Queue: "orders", Consumer: "inventory"})
	require.NoError(t, err)
	m := message.NewMessage("u", []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	m.Metadata.Set(sluice.EventTypeKey, "order.created")
	m.Metadata.Set(metakeys.SourceExchange, "orders-x")
	m.Metadata.Set(metakeys.SourceRoutingKey, "orders")
	m.Metadata.Set(sluice.TraceparentKey, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	require.NoError(t, run(mw, m, sluice.Poison(errors.New("missing field sku"))))
	require.Len(t, pub.got, 1)
	md := pub.got[0].Metadata
	for _, k := range append(table, runbook...) {
		_, ok := md[k]
		require.True(t, ok, "the docs list %s; the poisoned copy does not carry it (it carries %v)", k, md)
	}
}
