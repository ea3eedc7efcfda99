#!/usr/bin/env bash
# fuzz.sh TARGET... (each name:package): runs every fuzz target for
# FUZZTIME (20000x by default), FUZZ_JOBS of them at once (1 by default;
# make test runs 2: most of a target's time is building its instrumented
# test binary, one core's work, while the chaos steps beside it mostly
# wait). Each target's output is printed whole when it ends; a failure
# fails the whole, once every target has run.
set -uo pipefail
: "${GO:=go}" "${FUZZTIME:=20000x}" "${FUZZ_JOBS:=1}"
export GO FUZZTIME
one() {
	local t=$1 out rc=0
	out=$($GO test -run '^$' -fuzz "^${t%%:*}$" -fuzztime "$FUZZTIME" "${t##*:}" 2>&1) || rc=$?
	printf 'fuzz %s (%s)%s\n%s\n' "${t%%:*}" "$FUZZTIME" "$([ $rc = 0 ] || echo ": FAILED")" "$out"
	return $rc
}
export -f one
printf '%s\n' "$@" | xargs -P "$FUZZ_JOBS" -I{} bash -c 'one "$1"' _ {}
