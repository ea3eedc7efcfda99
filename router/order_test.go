package router_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/router"
)

// stageAliases are the names the docs give the stages, to Order's names.
var stageAliases = map[string]string{
	"shutdowngrace": "ShutdownGrace", "shutdown grace": "ShutdownGrace",
	"trace": "Trace", "tracing": "Trace",
	"replay": "Replay", "order": "Order", "ordering": "Order",
	"poison": "Poison",
	"retry":  "Retry", "retrytiers": "Retry",
	"brake":    "Brake",
	"classify": "Classify", "classifier": "Classify",
	"inbox": "Inbox", "deduplication": "Inbox",
	"recoverer": "Recoverer",
}

// stageOf returns the stage an arrow-separated part of a line names
// ("// runs behind Trace" → Trace, "deduplication(tx) " → Inbox), or "".
func stageOf(part string, first, last bool) string {
	part = strings.ToLower(strings.Trim(strings.TrimSpace(strings.NewReplacer("`", "", "*", "", "/", " ").Replace(part)), "."))
	if i := strings.IndexAny(part, "(:"); i >= 0 {
		part = part[:i]
	}
	words := strings.Fields(part)
	switch {
	case len(words) == 0:
		return ""
	case first && len(words) > 1: // "... behind Trace", "shutdown grace"
		if s, ok := stageAliases[strings.Join(words[len(words)-2:], " ")]; ok {
			return s
		}
		return stageAliases[words[len(words)-1]]
	case len(words) > 1 && !last && stageAliases[strings.Join(words[:2], " ")] != "":
		return stageAliases[strings.Join(words[:2], " ")]
	}
	return stageAliases[words[0]]
}

// The order of the stages is written once, in router's table (Order); every
// doc comment and doc that draws it as a chain of arrows agrees with it: the
// stages it names in Order's order, and a chain from the outermost stage to
// the handler names every stage. Before, three of five such chains lacked
// Replay or Brake.
func TestTheStageOrderIsWrittenOnce(t *testing.T) {
	t.Parallel()
	order := router.Order()
	require.Equal(t, []string{"ShutdownGrace", "Trace", "Replay", "Order", "Poison", "Retry", "Brake", "Classify", "Inbox", "Recoverer"}, order)
	chains := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "amqp091" || d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() == "CHANGELOG.md" || d.Name() == "order_test.go" || !strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".md") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for n := 1; sc.Scan(); n++ {
			parts := strings.Split(sc.Text(), "→")
			if len(parts) < 4 {
				continue
			}
			var stages []string
			for i, p := range parts {
				if s := stageOf(p, i == 0, i == len(parts)-1); s != "" {
					stages = append(stages, s)
				}
			}
			if len(stages) < 4 {
				continue // not a drawing of the stages
			}
			chains++
			where := path + ":" + strconv.Itoa(n)
			idx := make([]int, len(stages))
			for i, s := range stages {
				idx[i] = slices.Index(order, s)
			}
			require.True(t, slices.IsSorted(idx) && len(slices.Compact(slices.Clone(idx))) == len(idx),
				"%s draws the stages as %v: not in the one order %v", where, stages, order)
			lastWord := strings.Fields(strings.ToLower(parts[len(parts)-1]))
			if stages[0] == order[0] && len(lastWord) > 0 && strings.HasPrefix(lastWord[0], "handler") {
				require.Equal(t, order, stages, "%s draws the whole stack: it must name every stage", where)
			}
		}
		return sc.Err()
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, chains, 5, "the chains in the doc comments and docs were found")
}
