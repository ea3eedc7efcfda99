package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sluicemq/sluice/ordering"
)

// checkOrdered reads each key's effects in commit order and checks them
// against the plan; the other problems are the poison queue's contents
// and, before the skips, the waiting keys.
func (w *world) checkOrdered(ctx context.Context, ow *orderedWorld, skipped bool) ([]orderViolation, []string, error) {
	var rows []struct {
		Key string `db:"order_key"`
		Seq int    `db:"seq"`
	}
	// Within a key one transaction commits before the next one begins
	// (one delivery of a key at a time): n's order is the commit order.
	if err := w.db.SelectContext(ctx, &rows, "SELECT order_key, seq FROM "+w.name+".effects ORDER BY n"); err != nil {
		return nil, nil, err
	}
	applied := map[string][]int{}
	for _, r := range rows {
		applied[r.Key] = append(applied[r.Key], r.Seq)
	}
	violations := checkOrder(ow.plan, applied, skipped)
	var problems []string
	_, poisoned, _, err := w.observe(ctx)
	if err != nil {
		return nil, nil, err
	}
	heads := map[string]bool{}
	for key, at := range ow.plan.poisonAt {
		heads[orderedEventID(key, at)] = true
	}
	for id := range poisoned {
		if !heads[id] {
			problems = append(problems, "not a poisoned head, in the poison queue: "+id)
		}
	}
	for id := range heads {
		if poisoned[id] == 0 {
			problems = append(problems, "poisoned head not in the poison queue: "+id)
		}
	}
	if ow.control || skipped {
		return violations, problems, nil
	}
	keys, err := ow.store.Keys(ctx, orderedHandlerName, len(ow.plan.poisonAt)+10)
	if err != nil {
		return nil, nil, err
	}
	waiting := map[string]ordering.Key{}
	for _, k := range keys {
		waiting[k.Key] = k
	}
	for key, at := range ow.plan.poisonAt {
		k, ok := waiting[key]
		want := ordering.Key{Key: key, Head: orderedEventID(key, at), Poisoned: true, Held: ow.plan.perKey - at - 1}
		if !ok || k.Head != want.Head || !k.Poisoned || k.Held != want.Held {
			problems = append(problems, fmt.Sprintf("poisoned key %s waits as %+v, want head %s poisoned holding %d (it holds %s)", key, k, want.Head, want.Held, w.heldIDs(ctx, key)))
		}
		delete(waiting, key)
	}
	for key, k := range waiting {
		problems = append(problems, fmt.Sprintf("key %s waits and should not: %+v", key, k))
	}
	return violations, problems, nil
}

// heldIDs lists the event ids key holds, in the order held: what a
// failed check of the held count shows.
func (w *world) heldIDs(ctx context.Context, key string) string {
	var ids []string
	if err := w.db.SelectContext(ctx, &ids, "SELECT event_id FROM "+w.name+".order_held WHERE consumer = $1 AND order_key = $2 ORDER BY seq", orderedHandlerName, key); err != nil {
		return "? (" + err.Error() + ")"
	}
	return strings.Join(ids, " ")
}

func summarize(vs []orderViolation) string {
	kinds := map[string]int{}
	for _, v := range vs {
		kinds[v.kind]++
	}
	var parts []string
	for _, k := range []string{"out of order", "twice", "missing", "unexpected"} {
		if kinds[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", kinds[k], k))
		}
	}
	s := strings.Join(parts, ", ")
	if len(vs) > 0 {
		s += "; first: " + vs[0].String()
	}
	return s
}

func violationsError(vs []orderViolation, problems []string) error {
	var lines []string
	for i, v := range vs {
		if i == 10 {
			lines = append(lines, fmt.Sprintf("… %d more keys", len(vs)-10))
			break
		}
		lines = append(lines, v.String())
	}
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("… %d more", len(problems)-10))
	}
	return errors.New(strings.Join(append(lines, problems...), "; "))
}
