#!/usr/bin/env bash
# A private RabbitMQ cluster on this machine, next to the shared broker, for
# tests and drills that kill nodes. It never touches the shared node
# (rabbit@<host> on 5672): its nodes have names, AMQP and distribution ports,
# data and log directories of their own, under one state directory, and no
# plugins. They run as the rabbitmq user (like internal/testenv's private
# node), so they share that user's Erlang cookie and need root to start.
#
#   rabbitmq-cluster.sh start          start the nodes (create and join them the first time)
#   rabbitmq-cluster.sh start N        start node N again (after kill or stop N); it rejoins
#   rabbitmq-cluster.sh stop           stop every node and remove the state directory
#   rabbitmq-cluster.sh stop N         stop node N cleanly (rabbitmqctl stop)
#   rabbitmq-cluster.sh kill N         kill -9 node N's Erlang VM (a crash: no clean shutdown)
#   rabbitmq-cluster.sh status         each node: running or down, and the cluster's view
#   rabbitmq-cluster.sh urls           the nodes' AMQP URLs, comma-separated
#   rabbitmq-cluster.sh node N         node N's Erlang name
#   rabbitmq-cluster.sh ctl N ARGS...  rabbitmqctl ARGS against node N
#
# Nodes are numbered from 1. Environment (read by start, remembered in the
# state directory for the other commands):
#   SLUICE_CLUSTER_DIR        state directory (default /tmp/sluice-rabbitmq-cluster)
#   SLUICE_CLUSTER_SIZE       number of nodes (default 3)
#   SLUICE_CLUSTER_NAME       node name prefix: NAME1@localhost ... (default sluice-c)
#   SLUICE_CLUSTER_PORTS      the nodes' AMQP ports, space-separated (default 5781 5782 ...)
#   SLUICE_CLUSTER_DIST_PORTS their Erlang distribution ports (default 25781 25782 ...)
set -euo pipefail

dir=${SLUICE_CLUSTER_DIR:-/tmp/sluice-rabbitmq-cluster}
startup_timeout=${SLUICE_CLUSTER_STARTUP_TIMEOUT:-90}

log() { printf 'rabbitmq-cluster: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# load reads the cluster's settings: from the state directory once it
# exists, else from the environment.
load() {
  if [ -f "$dir/cluster.env" ]; then
    # shellcheck source=/dev/null
    . "$dir/cluster.env"
    return
  fi
  size=${SLUICE_CLUSTER_SIZE:-3}
  prefix=${SLUICE_CLUSTER_NAME:-sluice-c}
  ports=${SLUICE_CLUSTER_PORTS:-}
  dist_ports=${SLUICE_CLUSTER_DIST_PORTS:-}
  if [ -z "$ports" ]; then
    for ((i = 1; i <= size; i++)); do ports="$ports $((5780 + i))"; done
  fi
  if [ -z "$dist_ports" ]; then
    for ((i = 1; i <= size; i++)); do dist_ports="$dist_ports $((25780 + i))"; done
  fi
  read -ra p <<<"$ports"
  read -ra d <<<"$dist_ports"
  [ "${#p[@]}" -eq "$size" ] && [ "${#d[@]}" -eq "$size" ] || die "SLUICE_CLUSTER_PORTS and SLUICE_CLUSTER_DIST_PORTS need $size ports each"
  for port in "${p[@]}" "${d[@]}"; do
    case $port in 5672 | 25672 | 4369) die "port $port belongs to the shared broker" ;; esac
  done
}

node() { echo "${prefix}$1@localhost"; }
port() { local p; read -ra p <<<"$ports"; echo "${p[$(($1 - 1))]}"; }
dist_port() { local d; read -ra d <<<"$dist_ports"; echo "${d[$(($1 - 1))]}"; }
ctl() { local n=$1; shift; rabbitmqctl -q -n "$(node "$n")" "$@"; }

check_n() {
  [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$size" ] || die "no node $1 (nodes 1..$size)"
}

# create writes the state directory: the settings, and each node's config
# and empty plugin list, owned by the rabbitmq user the nodes run as.
create() {
  mkdir -p "$dir"
  cat >"$dir/cluster.env" <<EOF
size=$size
prefix='$prefix'
ports='$ports'
dist_ports='$dist_ports'
EOF
  for ((i = 1; i <= size; i++)); do
    mkdir -p "$dir/node$i/log" "$dir/node$i/mnesia"
    printf 'listeners.tcp.local = 127.0.0.1:%s\n' "$(port "$i")" >"$dir/node$i/rabbitmq.conf"
    printf '[].\n' >"$dir/node$i/enabled_plugins"
  done
  chown -R rabbitmq:rabbitmq "$dir"
  su rabbitmq -s /bin/sh -c "test -w '$dir/node1/mnesia'" || die "the rabbitmq user cannot write $dir: is a directory above it private?"
}

# launch starts node N detached; it returns before the node is up.
launch() {
  local n=$1 nd="$dir/node$1"
  env RABBITMQ_NODENAME="$(node "$n")" RABBITMQ_NODE_PORT="$(port "$n")" RABBITMQ_DIST_PORT="$(dist_port "$n")" \
    RABBITMQ_CONFIG_FILE="$nd/rabbitmq.conf" RABBITMQ_MNESIA_BASE="$nd/mnesia" RABBITMQ_LOG_BASE="$nd/log" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$nd/enabled_plugins" RABBITMQ_PID_FILE="$nd/pid" \
    rabbitmq-server -detached
}

# await waits until node N has booted; await_startup fails at once until the
# node has registered with epmd, hence the retries.
await() {
  local n=$1 deadline=$((SECONDS + startup_timeout))
  until ctl "$n" await_startup --timeout "$startup_timeout" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$dir/node$n"/log/*.log >&2 || true
      die "node $(node "$n") did not start within ${startup_timeout}s"
    fi
    sleep 0.2
  done
}

running() { ctl "$1" ping >/dev/null 2>&1; }

start_all() {
  load
  [ -f "$dir/cluster.env" ] || create
  local i
  for ((i = 1; i <= size; i++)); do running "$i" || launch "$i"; done
  for ((i = 1; i <= size; i++)); do await "$i"; done
  for ((i = 2; i <= size; i++)); do
    [ -f "$dir/node$i/joined" ] && continue
    ctl "$i" stop_app
    ctl "$i" join_cluster "$(node 1)"
    ctl "$i" start_app
    touch "$dir/node$i/joined"
  done
  log "$size nodes up: $(urls)"
}

start_one() {
  load
  [ -f "$dir/cluster.env" ] || die "no cluster in $dir: run start first"
  check_n "$1"
  running "$1" || launch "$1"
  await "$1"
}

stop_all() {
  load
  local i
  if [ -f "$dir/cluster.env" ]; then
    for ((i = 1; i <= size; i++)); do ctl "$i" stop >/dev/null 2>&1 || (kill_one "$i") 2>/dev/null || true; done
    rm -rf "$dir"
  fi
}

stop_one() {
  load
  check_n "$1"
  ctl "$1" stop
}

# kill_one sends SIGKILL to node N's Erlang VM and waits until it is gone.
kill_one() {
  load
  check_n "$1"
  local pid
  pid=$(cat "$dir/node$1/pid" 2>/dev/null) || die "node $(node "$1") has no pid file: not started?"
  kill -0 "$pid" 2>/dev/null || die "node $(node "$1") (pid $pid) is not running"
  kill -9 "$pid"
  local deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "pid $pid survived kill -9 for 10s"
    sleep 0.05
  done
}

urls() {
  local i out=""
  for ((i = 1; i <= size; i++)); do out="$out${out:+,}amqp://guest:guest@127.0.0.1:$(port "$i")/"; done
  echo "$out"
}

status() {
  load
  [ -f "$dir/cluster.env" ] || { echo "no cluster in $dir"; return 0; }
  local i up=""
  for ((i = 1; i <= size; i++)); do
    if running "$i"; then
      echo "$(node "$i") amqp 127.0.0.1:$(port "$i") running"
      up=${up:-$i}
    else
      echo "$(node "$i") amqp 127.0.0.1:$(port "$i") down"
    fi
  done
  [ -z "$up" ] || ctl "$up" cluster_status
}

cmd=${1:-}
shift || true
case $cmd in
  start) if [ $# -eq 0 ]; then start_all; else start_one "$1"; fi ;;
  stop) if [ $# -eq 0 ]; then stop_all; else stop_one "$1"; fi ;;
  kill) [ $# -eq 1 ] || die "usage: kill N"; kill_one "$1" ;;
  status) status ;;
  urls) load; urls ;;
  node) load; check_n "${1:-0}"; node "$1" ;;
  ctl) load; n=${1:-0}; check_n "$n"; shift; ctl "$n" "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
