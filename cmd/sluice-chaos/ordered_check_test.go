package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/internal/testenv"
)

// TestMain runs the test binary as the ordered scenario's consumer process
// when the harness starts it so (TestOrderedControlFailsTheCheck).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "ordered-consumer" {
		if err := orderedConsumerMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "ordered-consumer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// The checker accepts exactly the publish sequence per key and names each
// way a run can depart from it.
func TestCheckOrder(t *testing.T) {
	t.Parallel()
	p := orderPlan{keys: []string{"a", "b", "c"}, perKey: 5, poisonAt: map[string]int{"c": 2}}
	inOrder := map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {0, 1, 2, 3, 4}, "c": {0, 1}}
	require.Empty(t, checkOrder(p, inOrder, false))
	require.Equal(t, 5+5+2, p.reachable(false))
	require.Equal(t, 5+5+4, p.reachable(true))

	cases := []struct {
		name    string
		applied map[string][]int
		skipped bool
		want    []string
	}{
		{"a retried message applied after its key's later ones", map[string][]int{"a": {0, 2, 3, 1, 4}, "b": {0, 1, 2, 3, 4}, "c": {0, 1}}, false,
			[]string{"a: out of order: effect #1 is seq 2, want seq 1 (5 effects, want 5): [0 2 3 1 4]"}},
		{"an effect twice", map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {0, 1, 1, 2, 3, 4}, "c": {0, 1}}, false,
			[]string{"b: twice: effect #2 is seq 1, want seq 2 (6 effects, want 5): [0 1 1 2 3 4]"}},
		{"an effect missing", map[string][]int{"a": {0, 1, 2, 4}, "b": {0, 1, 2, 3, 4}, "c": {0, 1}}, false,
			[]string{"a: missing: effect #3 is seq 4, want seq 3 (4 effects, want 5): [0 1 2 4]"}},
		{"a poisoned key applied past its head (no hold)", map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {0, 1, 2, 3, 4}, "c": {0, 1, 3, 4}}, false,
			[]string{"c: unexpected: effect #2 is seq 3, want seq nothing (4 effects, want 2): [0 1 3 4]"}},
		{"after the skip, the rest out of order", map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {0, 1, 2, 3, 4}, "c": {0, 1, 4, 3}}, true,
			[]string{"c: out of order: effect #2 is seq 4, want seq 3 (4 effects, want 4): [0 1 4 3]"}},
		{"a key never published", map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {0, 1, 2, 3, 4}, "c": {0, 1}, "z": {0}}, false,
			[]string{"z: unexpected: 1 effects of a key never published"}},
	}
	for _, c := range cases {
		var got []string
		for _, v := range checkOrder(p, c.applied, c.skipped) {
			got = append(got, v.String())
		}
		require.Equal(t, c.want, got, c.name)
	}
	require.Empty(t, checkOrder(p, map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {0, 1, 2, 3, 4}, "c": {0, 1, 3, 4}}, true), "after the skip, the rest in order")
}

// The plan has the shape the scenario promises: every key's messages in
// its order, a poisoned head per poisoned key (never its last message),
// about failProb of the others failing once or twice.
func TestMakeOrderPlan(t *testing.T) {
	t.Parallel()
	p := makeOrderPlan(rand.New(rand.NewPCG(1, 2)), 200, 50, 5, 0.10)
	require.Len(t, p.publishes, 200*50)
	require.Len(t, p.poisonAt, 5)
	next := map[string]int{}
	poisoned := 0
	for _, e := range p.publishes {
		require.Equal(t, next[e.Key], e.Seq, "key %s in its order", e.Key)
		next[e.Key]++
		if e.Poison {
			poisoned++
			require.Equal(t, p.poisonAt[e.Key], e.Seq)
			require.Less(t, e.Seq, 49)
		}
	}
	require.Equal(t, 5, poisoned)
	require.InDelta(t, 0.10, float64(len(p.fail))/float64(len(p.publishes)), 0.02)
	twice := 0
	for _, n := range p.fail {
		if n == 2 {
			twice++
		}
	}
	require.InDelta(t, 1.0/3, float64(twice)/float64(len(p.fail)), 0.08)
}

// The ordered scenario's check fails on a real run without Stages.Order:
// the control runs the same plan (retries, poisoned heads) through the
// stack without the stage, on RabbitMQ and PostgreSQL, its consumer this
// test binary (TestMain); it passes only when the check finds keys out of
// order, and names them.
func TestOrderedControlFailsTheCheck(t *testing.T) {
	t.Parallel()
	o := options{amqpURL: testenv.AMQPURL, pgURL: testenv.PostgresURL, timeout: 2 * time.Minute, tiers: "200ms,400ms", seed: 7,
		ordered: orderedOptions{keys: 10, perKey: 8, poisoned: 1, failProb: 0.2}}
	line, err := runOrdered(context.Background(), o, orderedControl)
	require.NoError(t, err, line)
	require.Regexp(t, `without Stages.Order the check finds [1-9]\d* of 10 keys violated \(.*(out of order|unexpected)`, line)
}

// Two runs of one seed name their schemas and queues apart: a run killed
// before its cleanup leaves its schema, which the next run of the seed
// met as "already exists".
func TestTwoRunsOfASeedNameTheirWorldsApart(t *testing.T) {
	a := worldName(orderedControl, rand.New(rand.NewPCG(7, 7)))
	b := worldName(orderedControl, rand.New(rand.NewPCG(7, 7)))
	require.NotEqual(t, a, b)
}
