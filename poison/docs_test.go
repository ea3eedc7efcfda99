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
	"github.com/sluicemq/sluice/poison"
)

// documentedKeys returns the header names the diagnosis table of
// docs/poison.md lists, and those docs/operations.md names.
func documentedKeys(t *testing.T) (table, runbook []string) {
	t.Helper()
	key := regexp.MustCompile("`(sluice_[a-z_]+)`")
	doc, err := os.ReadFile("../docs/poison.md")
	require.NoError(t, err)
	text := string(doc)
	start := strings.Index(text, "| key (AMQP header) | value |")
	require.GreaterOrEqual(t, start, 0, "docs/poison.md has the diagnosis table")
	for _, line := range strings.Split(text[start:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		for _, m := range key.FindAllStringSubmatch(strings.Split(line, "|")[1], -1) {
			table = append(table, m[1])
		}
	}
	ops, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	text = string(ops)
	start = strings.Index(text, "carries its diagnosis as headers")
	require.GreaterOrEqual(t, start, 0, "docs/operations.md lists the diagnosis headers")
	end := strings.Index(text[start:], "\n\n")
	for _, m := range key.FindAllStringSubmatch(text[start:start+end], -1) {
		runbook = append(runbook, m[1])
	}
	return table, runbook
}

// Every header the docs say a poisoned copy carries, it carries. Before,
// docs/poison.md and docs/operations.md listed sluice_poison_attempts and
// sluice_poison_first_failed_at, which no copy has carried since the copies
// keep the retry stage's own sluice_attempt and sluice_first_failed_at.
func TestThePoisonedCopyCarriesTheDocumentedHeaders(t *testing.T) {
	t.Parallel()
	table, runbook := documentedKeys(t)
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
