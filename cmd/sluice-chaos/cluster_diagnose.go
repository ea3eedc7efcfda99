package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// traceLog keeps the consumers' trace lines (consumer --trace) per event
// id, a bounded number per id, for diagnose to show the missing events'.
type traceLog struct {
	mu    sync.Mutex
	lines map[string][]string
}

// traceLinesPerEvent bounds what is kept of one event: an event taking
// every tier has about 20 lines.
const traceLinesPerEvent = 40

func (t *traceLog) add(id, line string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lines == nil {
		t.lines = map[string][]string{}
	}
	if len(t.lines[id]) < traceLinesPerEvent {
		t.lines[id] = append(t.lines[id], line)
	}
}

func (t *traceLog) of(id string) []string {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines[id]...)
}

// diagnoseLimit bounds what the broker's report adds to the output.
const diagnoseLimit = 8000

// diagnose says, when the scenario did not settle, where the events
// without an effect may be: the kills' moments, what the cluster's quorum
// queues hold beyond their ready messages (checked out to consumers, and
// dead-lettered messages the queue's dead-letter worker has not settled:
// num_discarded waiting for it, num_discard_checked_out sent by it and not
// yet confirmed by the target queue), each at-least-once dead-letter
// worker's unconfirmed copies and its clients of the target queues, and
// the missing events with the consumers' trace of them. Bounded.
func (w *world) diagnose(p plan) string {
	var b strings.Builder
	b.WriteString("  diagnostics (the scenario did not settle):\n")
	for i, k := range w.cl.kills {
		fmt.Fprintf(&b, "    kill %d: node %d (leading %s) SIGKILLed at %s, started again at %s\n",
			i+1, k.node+1, strings.Join(k.led, ", "), wallClock(k.when), wallClock(k.restarted))
	}
	report := w.brokerReport()
	b.WriteString(indent(report, "    "))
	// What the nodes logged of the queues the second kill's node led (the
	// poison queue, the tiers): elections, members started anew.
	if logs := w.cl.c.LogLines([]string{w.topo.Config().PoisonQueue + "'", w.topo.Tiers()[0].Topic + "'", w.topo.Config().Queue + "'"}, 15); logs != "" {
		b.WriteString("    the nodes' log lines about the main queue, the first tier and the poison queue:\n")
		b.WriteString(indent(logs, "      "))
	}
	effects, poisoned, _, err := w.observe(context.Background())
	if err != nil {
		fmt.Fprintf(&b, "    reading the effects: %v\n", err)
		return b.String()
	}
	missing, unpoisoned := absent(p.valid, effects), absent(p.bad, poisoned)
	payloads := map[string]string{}
	for _, pub := range p.publishes {
		payloads[pub.id] = pub.payload
	}
	for _, list := range []struct {
		what string
		ids  []string
	}{{"valid events without an effect", missing}, {"bad events not in the poison queue", unpoisoned}} {
		fmt.Fprintf(&b, "    %d %s", len(list.ids), list.what)
		const shown = 12
		if len(list.ids) > shown {
			fmt.Fprintf(&b, " (the first %d shown)", shown)
		}
		b.WriteString(":\n")
		for _, id := range list.ids[:min(len(list.ids), shown)] {
			fmt.Fprintf(&b, "      %s %s\n", id, payloads[id])
			lines := w.traces.of(id)
			if len(lines) == 0 {
				b.WriteString("        no consumer traced it: never delivered\n")
			}
			for _, l := range lines {
				fmt.Fprintf(&b, "        %s\n", l)
			}
		}
	}
	b.WriteString(digest(w.cl.kills, report, missing, unpoisoned, w.traces))
	return b.String()
}

// recheck observes again, every second for recheckFor, and says when the
// effects, the poisoned events and the queues' depth change: whether what
// verify found missing comes back (late) or not (lost).
func (w *world) recheck(p plan) string {
	var b strings.Builder
	start, last := time.Now(), ""
	for time.Since(start) < recheckFor {
		effects, poisoned, depth, err := w.observe(context.Background())
		now := fmt.Sprintf("%d/%d effects, %d/%d poisoned, %d in the main and tier queues", len(effects), len(p.valid), len(poisoned), len(p.bad), depth)
		if err != nil {
			now = "observing: " + err.Error()
		}
		if now != last {
			fmt.Fprintf(&b, "  digest: recheck +%s: %s\n", time.Since(start).Round(100*time.Millisecond), now)
			last = now
		}
		time.Sleep(time.Second)
	}
	return b.String()
}

// recheckFor bounds recheck.
const recheckFor = 30 * time.Second

// brokerReport asks the first node that answers, with rabbitmqctl eval,
// for each of the scenario's quorum queues' Raft state (rabbit_fifo's
// overview, from the queue's leader) and for the state of every
// dead-letter worker (rabbit_fifo_dlx_worker, one per quorum queue with
// x-dead-letter-strategy=at-least-once, on the queue's leader) on the
// nodes up. Written against RabbitMQ 3.10's modules; a failure is
// reported in place of the part that failed.
func (w *world) brokerReport() string {
	var names []string
	for _, q := range w.queues(true) {
		names = append(names, fmt.Sprintf("<<%q>>", q))
	}
	expr := strings.ReplaceAll(brokerReportErl, "NAMES", strings.Join(names, ", "))
	var errs []string
	for i := range w.cl.c.Nodes {
		out, err := w.cl.c.TryCtl(i, "eval", expr)
		if err != nil {
			errs = append(errs, fmt.Sprintf("node %d: %v", i+1, err))
			continue
		}
		out = strings.TrimSuffix(strings.TrimSpace(out), "ok")
		if len(out) > diagnoseLimit {
			out = out[:diagnoseLimit] + fmt.Sprintf("… (%d characters cut)", len(out)-diagnoseLimit)
		}
		return fmt.Sprintf("node %d reports:\n%s\n", i+1, strings.TrimSpace(out))
	}
	return "no node answered rabbitmqctl eval: " + strings.Join(errs, "; ") + "\n"
}

// brokerReportErl is brokerReport's expression; NAMES is replaced by the
// queues' names as Erlang binaries. The dead-letter worker's state is
// read through sys:get_status (its format_status: the copies awaiting a
// confirm, "pendings"); its clients of the target quorum queues
// (rabbit_fifo_client's #state{}, found by shape: leader, pending
// commands, resend timer) are read from its queue_type_state.
const brokerReportErl = `
Now = os:system_time(millisecond),
Keys = [num_ready_messages, num_checked_out, num_messages, num_enqueuers, num_consumers, num_discarded, num_discard_checked_out],
Queue = fun(N) ->
  case rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, N)) of
    {ok, Q} ->
      {RaName, LNode} = amqqueue:get_pid(Q),
      case catch ra:local_query({RaName, LNode}, fun rabbit_fifo:overview/1, 5000) of
        {ok, {_, M}, _} -> io:format("queue ~ts: leader ~ts ~0p~n", [N, LNode, maps:with(Keys, M)]);
        E -> io:format("queue ~ts: leader ~ts: ~0P~n", [N, LNode, E, 8])
      end;
    E -> io:format("queue ~ts: ~0P~n", [N, E, 8])
  end
end,
lists:foreach(Queue, [NAMES]),
Clients = fun Walk(T, Acc) when is_tuple(T), tuple_size(T) =:= 11, element(1, T) =:= state, is_map(element(9, T)) ->
                [{leader, element(3, T), queue_status, element(4, T), pending, maps:size(element(9, T)), resend_timer, element(11, T) =/= undefined} | Acc];
              Walk(T, Acc) when is_tuple(T) -> Walk(tuple_to_list(T), Acc);
              Walk(T, Acc) when is_map(T) -> Walk(maps:to_list(T), Acc);
              Walk([H | R], Acc) -> Walk(R, Walk(H, Acc));
              Walk(_, Acc) -> Acc
          end,
Worker = fun(P) ->
  case catch sys:get_status(P, 5000) of
    {status, _, _, [_, _, _, _, Misc]} ->
      case [S || {data, D} <- Misc, {"State", S} <- D, is_map(S)] of
        [S | _] ->
          Pend = maps:get(pendings, S),
          io:format("dlx worker ~0p on ~ts for ~ts: dlx client ~0p; ~b copies awaiting a confirm (the oldest: {seq, [unconfirmed target], [target that rejected it], publishes, ms since consumed}) ~0P; settle timeout ~b ms, timer ~0p; target queue clients ~0p~n",
            [P, node(P), element(4, maps:get(queue_ref, S)), maps:get(dlx_client_state, S), maps:size(Pend),
             [{Seq, [element(4, U) || U <- maps:get(unsettled, X)], [element(4, U) || U <- maps:get(rejected, X)], maps:get(publish_count, X), Now - maps:get(consumed_at, X)}
              || {Seq, X} <- lists:sublist(lists:sort(maps:to_list(Pend)), 5)], 20,
             maps:get(settle_timeout, S), maps:get(timer_is_active, S), Clients(maps:get(queue_type_state, S), [])]);
        [] -> io:format("dlx worker ~0p on ~ts: ~0P~n", [P, node(P), Misc, 12])
      end;
    E -> io:format("dlx worker ~0p: ~0P~n", [P, E, 8])
  end
end,
lists:foreach(fun(Nd) ->
  case catch rpc:call(Nd, supervisor, which_children, [rabbit_fifo_dlx_sup], 5000) of
    L when is_list(L) -> lists:foreach(Worker, [P || {_, P, _, _} <- L, is_pid(P)]);
    E -> io:format("node ~ts: ~0P~n", [Nd, E, 8])
  end
end, [node() | nodes()]),
ok.
`

// digest is the diagnosis in at most 8 short lines, each starting with
// "digest: ", for scripts/test.sh to repeat at the very end of make
// test's output (CI keeps only its last lines): the kills, what the report
// says of dead-lettered copies the broker holds (the queues' and workers'
// lines with a count other than 0), and the last trace line of the first
// valid events without an effect and of the first bad events not in the
// poison queue.
func digest(kills []*nodeKill, report string, missing, unpoisoned []string, traces *traceLog) string {
	var b strings.Builder
	line := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		if len(s) > digestWidth {
			s = s[:digestWidth] + "…"
		}
		b.WriteString("  digest: " + s + "\n")
	}
	var ks []string
	for _, k := range kills {
		ks = append(ks, fmt.Sprintf("node %d %s–%s", k.node+1, wallClock(k.when), wallClock(k.restarted)))
	}
	line("%d valid events without an effect, %d bad events not in the poison queue; kills: %s", len(missing), len(unpoisoned), strings.Join(ks, ", "))
	held := 0
	for _, l := range strings.Split(report, "\n") {
		if held < 3 && heldCopies.MatchString(l) {
			held++
			line("%s", strings.TrimSpace(l))
		}
	}
	if held == 0 {
		line("the broker reports no dead-lettered copy held (num_discarded, num_discard_checked_out, a worker's copies awaiting a confirm)")
	}
	for _, id := range slices.Concat(missing[:min(len(missing), 3)], unpoisoned[:min(len(unpoisoned), 3)]) {
		lines := traces.of(id)
		if len(lines) == 0 {
			line("%s: never delivered", id)
			continue
		}
		line("%s: %d trace lines, the last: %s", id, len(lines), strings.TrimSpace(lines[len(lines)-1]))
	}
	return b.String()
}

// digestWidth bounds a digest line (scripts/test.sh cuts at 240).
const digestWidth = 200

// heldCopies matches brokerReport's lines that show dead-lettered copies
// the broker holds: a queue's num_discarded or num_discard_checked_out
// above 0, a dead-letter worker with copies awaiting a confirm.
var heldCopies = regexp.MustCompile(`num_discard(ed|_checked_out) => [1-9]|[1-9][0-9]* copies awaiting a confirm`)

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// wallClock formats t for the diagnostics, or "-" if unset.
func wallClock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format("15:04:05.000")
}
