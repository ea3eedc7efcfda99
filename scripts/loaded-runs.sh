#!/usr/bin/env bash
# Fresh-clone runs of CI's command under load, one after another: how
# docs/reliability.md's "Fresh-clone runs under load" were made.
#   bash scripts/loaded-runs.sh [RUNS] [COMMIT]    (default 10 runs of HEAD)
# Each run clones this repository at COMMIT into a directory of its own,
# starts `stress-ng --cpu 2 --cpu-load 50` and runs `CI=true bash .ci/run`
# there, then prints one line: the run, the commit, its exit status, its
# time, the load average at its end and its log. It needs stress-ng
# (apt-get install stress-ng) and runs make test, which restarts the shared
# RabbitMQ and PostgreSQL: nothing else should use them meanwhile.
# SLUICE_LOADED_STRESS=0 runs them with no load (an idle run's time).
# Every run clones into the same directory, SLUICE_LOADED_CLONE
# (/tmp/sluice-loaded-clone): Go's build cache keys a test binary on its
# sources' paths, so only the first run on a machine compiles every package
# with -race again (about 15 minutes of a 2-core machine); a later series
# reuses what the last one built.
set -u
runs=${1:-10}
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse "${2:-HEAD}")
stress=${SLUICE_LOADED_STRESS:-1}
[ "$stress" = 0 ] || command -v stress-ng >/dev/null || { echo "loaded-runs: stress-ng is not installed (apt-get install stress-ng)" >&2; exit 2; }
logs=$(mktemp -d /tmp/sluice-loaded-runs-XXXXXX)
failed=0
for i in $(seq 1 "$runs"); do
	wt=${SLUICE_LOADED_CLONE:-/tmp/sluice-loaded-clone}
	rm -rf "$wt" && git clone -q "$repo" "$wt" && git -C "$wt" checkout -q "$commit" || exit 2
	load=
	if [ "$stress" != 0 ]; then
		stress-ng --cpu 2 --cpu-load 50 --timeout 0 >/dev/null 2>&1 &
		load=$!
	fi
	start=$(date +%s)
	(cd "$wt" && CI=true timeout 90m bash .ci/run) >"$logs/run-$i.log" 2>&1
	rc=$?
	if [ -n "$load" ]; then
		kill "$load" 2>/dev/null
		wait "$load" 2>/dev/null
	fi
	[ $rc = 0 ] || failed=$((failed + 1))
	echo "run $i ${commit:0:7} rc=$rc $(($(date +%s) - start))s load=$(cut -d' ' -f1-3 /proc/loadavg) $logs/run-$i.log"
done
rm -rf "${SLUICE_LOADED_CLONE:-/tmp/sluice-loaded-clone}"
echo "$((runs - failed)) of $runs green; logs in $logs"
[ $failed = 0 ]
