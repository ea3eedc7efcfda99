package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// make test runs the short chaos run in parts (scripts/test.sh), some side
// by side: together they are the default list, each scenario once.
func TestMakeTestRunsEveryDefaultScenarioOnce(t *testing.T) {
	script, err := os.ReadFile("../../scripts/test.sh")
	require.NoError(t, err)
	var ran []string
	for _, m := range regexp.MustCompile(`sluice-chaos" run -scenarios (\S+)`).FindAllStringSubmatch(string(script), -1) {
		ran = append(ran, strings.Split(m[1], ",")...)
	}
	require.NotEmpty(t, ran, "scripts/test.sh runs sluice-chaos with -scenarios")
	slices.Sort(ran)
	want := slices.Sorted(slices.Values(allScenarios))
	require.Equal(t, want, ran)
}
