#!/usr/bin/env bash
# Runs the same bench suites on an earlier commit and on the working tree,
# back to back on this machine, so their numbers can be compared:
#   scripts/bench-before-after.sh 81675d7 inbox,e2e,overhead
set -euo pipefail
rev=${1:?usage: scripts/bench-before-after.sh REV [SUITES]}
suites=${2:-inbox,e2e,overhead}
top=$(git rev-parse --show-toplevel)
before=$(mktemp -d)
trap 'git -C "$top" worktree remove --force "$before" >/dev/null 2>&1 || true' EXIT
git -C "$top" worktree add -q --detach "$before" "$rev"
echo "=== before: $(git -C "$before" log --oneline -1)"
(cd "$before" && go run ./cmd/sluice-bench -suite "$suites")
echo "=== after: $(git -C "$top" log --oneline -1) (working tree)"
(cd "$top" && go run ./cmd/sluice-bench -suite "$suites")
