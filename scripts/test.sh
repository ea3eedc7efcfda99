#!/usr/bin/env bash
# make test's steps (the Makefile passes its settings in the environment).
# Steps that share nothing run side by side, so that the whole stays under
# 10 minutes on an idle 2-core machine:
# after the main go test and the tests about RabbitMQ 4.x:
#   - the short fuzz runs (CPU only, no service) in the background, beside
#     the chaos steps, which mostly wait (on kills, restarts, a broker's
#     return: 35 s of CPU in the shared broker's 165 s). The fuzzing takes
#     about 440 CPU-seconds (make fuzz: 348 s user + 92 s system); beside
#     the main go test (660 CPU-seconds in 698 s in CI) the two wanted more
#     than the 2 cores gave;
#   - the scenarios that stop PostgreSQL, which every scenario uses, first;
#   - then the scenarios on private brokers (cluster-node-kill, ordered:
#     nodes of their own, the shared PostgreSQL) in the background, beside
#     the restart tests and the scenarios that restart the shared RabbitMQ
#     or fill its poison queue, then those on the 4.0 node.
#     TEST_CHAOS_PRIVATE_ALONE=1 runs them alone, last, as before.
# A background step's output is printed when it ends; the first failure
# fails the whole, after every step started has ended. Each step prints
# its time and the CPU it and its children used (a 2-core machine gives
# 2 CPU-seconds a second).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${GO:=go}" "${TEST_TIMEOUT:=20m}" "${TEST_PARALLEL:=6}" "${TEST_PACKAGES_AT_ONCE:=3}" "${FUZZTIME:=20000x}" "${PACKAGES:=./... ./cmd/... ./examples/...}"
# The main go test's events (go test -json), kept for make test-times.
: "${TEST_TIMES_FILE:=test-times.json}"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=()
step() { date +"%T $*"; }

# timed NAME CMD...: runs CMD, then prints its time and CPU.
timed() (
	TIMEFORMAT="$1: %R s, CPU %U s user + %S s system"
	shift
	time "$@"
)
# background NAME CMD...: runs CMD with its output in a log of its own.
declare -A pids
background() {
	local name=$1
	shift
	step "$name (in the background)"
	timed "$name" "$@" >"$logs/$name.log" 2>&1 &
	pids[$name]=$!
}
# await NAME: waits for a background step, prints its output, records a failure.
await() {
	local name=$1 rc=0
	wait "${pids[$name]}" || rc=$?
	step "$name: $([ $rc = 0 ] && echo passed || echo "FAILED ($rc)")"
	sed "s/^/[$name] /" "$logs/$name.log"
	[ $rc = 0 ] || failed+=("$name")
}
# foreground NAME CMD...: runs CMD, records a failure.
foreground() {
	local name=$1 rc=0
	shift
	step "$name"
	timed "$name" "$@" 2>&1 | tee "$logs/$name.log"
	rc=${PIPESTATUS[0]}
	[ $rc = 0 ] || failed+=("$name")
}

# The machine as the run starts: a run that is slow because something else
# holds the CPU (a benchmark, stress-ng, a private node an earlier run left)
# says so here.
# What a killed run left (private nodes, servers, browsers) is stopped first:
# it would hold CPU, memory and the shared broker's connections.
bash scripts/sweep.sh
step "the machine at start:$(uptime | sed 's/.*load average/ load average/'), $(nproc) cores"
ps -eo pcpu=,etimes=,comm= --sort=-pcpu | awk '$1 >= 10 {printf "  %s%% CPU for %ss: %s\n", $1, $2, $3}' | head -n 8

# go_test ARGS...: go test -json ARGS, printed as a plain go test prints
# (each package's line, a failed test's output) by internal/testtimes,
# which keeps the events in TEST_TIMES_FILE; its status is go test's.
$GO build -o "$logs/testtimes" ./internal/testtimes || failed+=("building testtimes")
go_test() { $GO test -json "$@" 2>&1 | "$logs/testtimes" -save "$TEST_TIMES_FILE"; }

# 3 test binaries at once: they mostly wait (on the brokers, the tiers'
# TTLs, private nodes booting) — at 2, 970 s of go test used 684 s of CPU
# on 2 cores. make services raises PostgreSQL's max_connections to 300 for
# their pools (at 4 they passed the default 100).
#
# The slowest test binaries first: go test starts packages in the order they
# are named (a package named twice runs once), and the step ends when its
# last package does. In path order the two slowest but one (cmd/sluice and
# cmd/internal/bench, 157 s and 155 s in CI) began last, when the others had
# ended, and ran alone on a machine with cores to spare. make test-times
# prints each package's time; keep this list its slowest.
: "${TEST_SLOW_PACKAGES:=./rabbitmq/internal/clustertest ./router ./cmd/sluice ./cmd/internal/bench ./rabbitmq ./sluicesql ./outbox}"
# shellcheck disable=SC2086 # the lists are lists
foreground "go test" go_test -race -count=1 -timeout "$TEST_TIMEOUT" -p "$TEST_PACKAGES_AT_ONCE" -parallel "$TEST_PARALLEL" $TEST_SLOW_PACKAGES $PACKAGES
# Where the time went (make test-times prints it again).
"$logs/testtimes" -top 25 "$TEST_TIMES_FILE" || true

# Alone: their rabbitmqctl calls each start an Erlang VM, and
# beside the main go test one listing outlived its 2 minutes; beside the
# restart tests and the chaos scenarios' private nodes starting, five did.
foreground "the tests about RabbitMQ 4.x on the 4.0 node" make --no-print-directory test-rabbitmq4

# Two fuzz targets at once: building a target's instrumented test binary
# is most of its time, one core's work, and the chaos steps beside it
# mostly wait. One at a time, the fuzzing (234 s, 258 CPU-s on a fresh
# clone) ended 46 s after the last chaos step: the end of make test.
background fuzz make --no-print-directory fuzz FUZZTIME="$FUZZTIME" FUZZ_JOBS=2
# The public API against the last release's (README "Compatibility").
background "the API against the last release" bash scripts/api.sh check

# The short reliability run (docs/reliability.md), in three parts.
$GO build -o "$logs/sluice-chaos" ./cmd/sluice-chaos || failed+=("building sluice-chaos")
# Every scenario uses the shared PostgreSQL: these stop it, alone.
foreground "chaos stopping PostgreSQL" "$logs/sluice-chaos" run -scenarios postgres-stop,postgres-stop-batched,postgres-stop-batch-handler
# The private brokers' scenarios (about 75 s alone on an idle machine: 3
# nodes and 1 node booting, then the run) beside the shared broker's.
# Once, beside the restart tests and the shared scenarios, one of them
# failed in CI with too little output kept to say which or why; the one
# failure of theirs on record since, ordered's held redelivery, was the
# ordering stage's (fixed), not a conflict between steps.
# TEST_CHAOS_PRIVATE_ALONE=1 runs them alone.
private_chaos() {
	"$logs/sluice-chaos" run -scenarios cluster-node-kill,ordered
}
[ -n "${TEST_CHAOS_PRIVATE_ALONE:-}" ] || background "chaos on private brokers" private_chaos
# Broker-restart tests restart the shared RabbitMQ: after the main go test.
foreground "restart tests" $GO test -race -count=1 -timeout 5m -tags restart -run Restart ./rabbitmq/
foreground "chaos on the shared RabbitMQ" "$logs/sluice-chaos" run -scenarios kill,rabbitmq-restart,poison-full,same-id-8,outbox,kill-batched,same-id-8-batch-handler,kill-batch-handler
# The same kills and a broker restart on the RabbitMQ 4.0 node (it restarts
# that node: nothing else uses it now).
foreground "chaos on the 4.0 node" "$logs/sluice-chaos" run -rabbitmq4 -scenarios kill,rabbitmq-restart -events 200 -kills 3
if [ -n "${TEST_CHAOS_PRIVATE_ALONE:-}" ]; then
	foreground "chaos on private brokers" private_chaos
else
	await "chaos on private brokers"
fi
await fuzz
await "the API against the last release"

if [ ${#failed[@]} -gt 0 ]; then
	# CI keeps only the end of the output, as little as its last 20
	# lines: repeat each failed step's end, then its failure lines, and
	# last a short digest of each (at most 12 lines of 240 characters:
	# the failures, and what a chaos scenario's diagnosis says of the
	# events missing and of the broker), so that the cause is in what it keeps.
	for name in "${failed[@]}"; do
		[ -f "$logs/$name.log" ] || continue
		step "$name: the end of its output, again:"
		tail -n 40 "$logs/$name.log" | sed "s/^/[$name] /"
		step "$name: its failure lines, again:"
		grep -E -e '--- FAIL|^FAIL|panic:|_test\.go:[0-9]+:|LOST|lost' "$logs/$name.log" | tail -n 80 | sed "s/^/[$name] /"
	done
	step "digest of the failures:"
	for name in "${failed[@]}"; do
		[ -f "$logs/$name.log" ] || continue
		grep -E -e '--- FAIL|^FAIL|panic:|_test\.go:[0-9]+:|^ *digest: ' "$logs/$name.log" | tail -n 12 | cut -c1-240 | sed "s/^ */[$name] /"
	done
	step "FAILED: ${failed[*]}"
	exit 1
fi
# A chaos scenario that passed with copies the broker confirmed and never
# gave back (cmd/sluice-chaos/dropped.go) says so last, where CI keeps it.
if grep -h -o 'BROKER LOSS: [0-9]* events[^(]*' "$logs"/*.log 2>/dev/null | sort | uniq -c | sed 's/^ */[chaos] /'; then
	step "the broker lost copies it had confirmed (above): not counted against Sluice, docs/reliability.md \"The broker's losses\""
fi
step "done: every step passed"
