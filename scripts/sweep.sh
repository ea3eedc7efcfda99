#!/usr/bin/env bash
# Stops what a killed test run left: the private RabbitMQ nodes, clusters,
# PostgreSQL servers, Redis clusters, headless Chromium and cluster network namespaces of
# a test binary that ended without its cleanup (a go test timeout, a
# SIGKILL, Ctrl-C twice). Each
# such directory holds owner.pid, the test binary that made it
# (internal/testenv.ClaimDir); the directory's processes are stopped and the
# directory removed once that process is gone. A run in progress — another
# make test, a developer's go test — keeps its own. A directory without
# owner.pid (made before it existed) is swept when nothing has written to it
# for 2 hours.
set -uo pipefail
roots=(/tmp)
[ -d /var/cache/sluice/rabbitmq-4.0/tmp ] && roots+=(/var/cache/sluice/rabbitmq-4.0/tmp)
swept=0
# in_dir DIR: the processes whose working directory is DIR.
in_dir() {
	local p
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/cwd" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"
	done
}
for root in "${roots[@]}"; do
	for d in "$root"/sluice-rabbitmq-* "$root"/sluice-cluster-* "$root"/sluice-postgres-* "$root"/sluice-chromium-* "$root"/sluice-cli-* "$root"/sluice-redis-*; do
		[ -d "$d" ] || continue
		owner=$(cat "$d/owner.pid" 2>/dev/null || true)
		if [[ "$owner" =~ ^[0-9]+$ ]]; then
			kill -0 "$owner" 2>/dev/null && continue
		else
			[ -n "$(find "$d" -maxdepth 2 -mmin -120 -print -quit 2>/dev/null)" ] && continue
		fi
		# The processes that name the directory, in their command line
		# (postgres -D, chromium --user-data-dir, the CLI's binary) or their
		# environment (a RabbitMQ node's beam.smp: RABBITMQ_MNESIA_BASE) or,
		# for a redis-server, which writes its title over both, its working
		# directory,
		# as the 4.0 node's chroot sees it too.
		name=${d#/var/cache/sluice/rabbitmq-4.0}
		pids=$( (pgrep -f -- "$name"; grep -lsF -- "$name" /proc/[0-9]*/environ | cut -d/ -f3; in_dir "$d") | sort -u | grep -vx "$$")
		# shellcheck disable=SC2086
		[ -n "$pids" ] && kill -9 $pids 2>/dev/null
		rm -rf "$d"
		echo "swept $d (its test binary${owner:+, pid $owner,} is gone): $(echo $pids | wc -w) processes stopped"
		swept=$((swept + 1))
	done
done
# A partitionable cluster's network namespace (testenv.PrivateCluster:
# sluicec-…-ns) outlives a killed run: one with no process in it, made more
# than 10 minutes ago (a cluster starting now has none yet), is deleted.
if command -v ip >/dev/null; then
	for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^sluicec-/ {print $1}'); do
		[ -n "$(find "/run/netns/$ns" -mmin -10 -print -quit 2>/dev/null)" ] && continue
		[ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && continue
		ip netns delete "$ns" 2>/dev/null && echo "swept network namespace $ns (no process in it)" && swept=$((swept + 1))
	done
fi
[ $swept = 0 ] || echo "swept $swept directories and namespaces a killed run left"
exit 0
