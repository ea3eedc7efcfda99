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
#   rabbitmq-cluster.sh partition N    cut node N off (SLUICE_CLUSTER_NETNS only)
#   rabbitmq-cluster.sh heal N         end node N's partition
#
# Nodes are numbered from 1. Environment (read by start, remembered in the
# state directory for the other commands):
#   SLUICE_CLUSTER_DIR        state directory (default /tmp/sluice-rabbitmq-cluster)
#   SLUICE_CLUSTER_SIZE       number of nodes (default 3)
#   SLUICE_CLUSTER_NAME       node name prefix: NAME1@localhost ... (default sluice-c)
#   SLUICE_CLUSTER_PORTS      the nodes' AMQP ports, space-separated (default 5781 5782 ...)
#   SLUICE_CLUSTER_DIST_PORTS their Erlang distribution ports (default 25781 25782 ...)
#   SLUICE_CLUSTER_NETNS      opt in to partitions: a network namespace, created by start
#                             (with the epmd in it) and deleted by stop, holding the nodes.
#                             Node N is NAME<N>@127.0.0.<10+N> (long names), listens for AMQP
#                             and the distribution on that address only, and connects to
#                             the other nodes from it. partition N drops every packet from
#                             or to that address on the namespace's loopback (tc): no reset,
#                             no ICMP error, as a host cut off by the network. The AMQP URLs
#                             are reachable only from inside the namespace (ip netns exec,
#                             or a socket opened there). Nothing outside it is touched.
#   SLUICE_CLUSTER_ROOT       run the nodes from this directory with chroot: the RabbitMQ 4.0
#                             directory of scripts/rabbitmq4.sh (default: the machine's
#                             RabbitMQ). SLUICE_CLUSTER_DIR must then be inside it; the nodes
#                             run as root there, with its Erlang cookie. Not with NETNS.
#   SLUICE_CLUSTER_NET_TICKTIME   the nodes' net_ticktime in seconds (default Erlang's, 60):
#                             how soon a node that stopped answering is seen as down
#   SLUICE_CLUSTER_PARTITION_HANDLING  cluster_partition_handling (default RabbitMQ's, ignore)
#   SLUICE_CLUSTER_DLX_CONFIRM_TIMEOUT  the nodes' dead_letter_worker_publisher_confirm_timeout in
#                             milliseconds (default RabbitMQ's, 180000), through advanced.config
#                             (RabbitMQ 3.10's rabbitmq.conf has no key for it): how long an
#                             at-least-once dead-letter worker waits before it sends again a copy
#                             the target queue rejected or did not confirm
set -euo pipefail

dir=${SLUICE_CLUSTER_DIR:-/tmp/sluice-rabbitmq-cluster}
startup_timeout=${SLUICE_CLUSTER_STARTUP_TIMEOUT:-180}

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
  netns=${SLUICE_CLUSTER_NETNS:-}
  root=${SLUICE_CLUSTER_ROOT:-}
  ticktime=${SLUICE_CLUSTER_NET_TICKTIME:-}
  partition_handling=${SLUICE_CLUSTER_PARTITION_HANDLING:-}
  dlx_confirm_timeout=${SLUICE_CLUSTER_DLX_CONFIRM_TIMEOUT:-}
  [[ $dlx_confirm_timeout =~ ^[0-9]*$ ]] || die "SLUICE_CLUSTER_DLX_CONFIRM_TIMEOUT must be milliseconds, got $dlx_confirm_timeout"
  if [ -z "$ports" ]; then
    for ((i = 1; i <= size; i++)); do ports="$ports $((5780 + i))"; done
  fi
  if [ -z "$dist_ports" ]; then
    for ((i = 1; i <= size; i++)); do dist_ports="$dist_ports $((25780 + i))"; done
  fi
  if [ -n "$root" ]; then
    [ -z "$netns" ] || die "SLUICE_CLUSTER_ROOT and SLUICE_CLUSTER_NETNS do not go together"
    case $dir in "$root"/*) ;; *) die "SLUICE_CLUSTER_DIR ($dir) must be inside SLUICE_CLUSTER_ROOT ($root)" ;; esac
  fi
  read -ra p <<<"$ports"
  read -ra d <<<"$dist_ports"
  [ "${#p[@]}" -eq "$size" ] && [ "${#d[@]}" -eq "$size" ] || die "SLUICE_CLUSTER_PORTS and SLUICE_CLUSTER_DIST_PORTS need $size ports each"
  for port in "${p[@]}" "${d[@]}"; do
    case $port in 5672 | 25672 | 4369) die "port $port belongs to the shared broker" ;; esac
  done
}

node() {
  if [ -n "$netns" ]; then echo "${prefix}$1@$(addr "$1")"; else echo "${prefix}$1@localhost"; fi
}
# addr is node N's address: its own in a namespace, else the loopback's.
addr() { if [ -n "$netns" ]; then echo "127.0.0.$((10 + $1))"; else echo 127.0.0.1; fi; }
# inns runs a command in the namespace, if any, with long node names there,
# an empty rabbitmq-env.conf (the system's is the shared node's, and may set
# ERL_FLAGS, inet_dist_use_interface 127.0.0.1, which would win over a
# node's own address, and ERL_EPMD_ADDRESS) and an inetrc that gives this
# host a long name the nodes resolve without DNS: rabbitmqctl's own node is
# named after the host, and the nodes answer it by connecting to it.
inns() {
  if [ -n "${root:-}" ]; then
    # The directory's own RabbitMQ, run as root: HOME holds the cookie that
    # scripts/rabbitmq4.sh's node and its rabbitmqctl share.
    chroot "$root" /usr/bin/env -i PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/var/lib/sluice-rmq4 LANG=C.UTF-8 "$@"
  elif [ -n "$netns" ]; then
    ip netns exec "$netns" env RABBITMQ_USE_LONGNAME=true RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
      ERL_INETRC="$dir/inetrc" "$@"
  else
    "$@"
  fi
}
port() { local p; read -ra p <<<"$ports"; echo "${p[$(($1 - 1))]}"; }
dist_port() { local d; read -ra d <<<"$dist_ports"; echo "${d[$(($1 - 1))]}"; }
ctl() { local n=$1; shift; inns rabbitmqctl -q -n "$(node "$n")" "$@"; }

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
netns='$netns'
root='$root'
ticktime='$ticktime'
partition_handling='$partition_handling'
dlx_confirm_timeout='$dlx_confirm_timeout'
EOF
  if [ -n "$netns" ]; then
    : >"$dir/rabbitmq-env.conf"
    cat >"$dir/inetrc" <<EOF
{domain, "sluice.invalid"}.
{host, {127,0,0,1}, ["$(hostname -s).sluice.invalid"]}.
{lookup, [file, native]}.
EOF
    ip netns add "$netns"
    ip netns exec "$netns" ip link set lo up
    # Packets to or from a partitioned node's address are dropped on the
    # way out of the loopback: its filters send them to class 1:1, whose
    # queue holds none (this kernel has no tc actions, such as drop, to
    # use instead). Every other packet goes through class 1:2, unlimited.
    ip netns exec "$netns" tc qdisc add dev lo root handle 1: htb default 2 r2q 100000
    ip netns exec "$netns" tc class add dev lo parent 1: classid 1:1 htb rate 100gbit
    ip netns exec "$netns" tc class add dev lo parent 1: classid 1:2 htb rate 100gbit
    ip netns exec "$netns" tc qdisc add dev lo parent 1:1 handle 10: pfifo limit 0
  fi
  for ((i = 1; i <= size; i++)); do
    mkdir -p "$dir/node$i/log" "$dir/node$i/mnesia"
    printf 'listeners.tcp.local = %s:%s\n' "$(addr "$i")" "$(port "$i")" >"$dir/node$i/rabbitmq.conf"
    [ -z "$partition_handling" ] || printf 'cluster_partition_handling = %s\n' "$partition_handling" >>"$dir/node$i/rabbitmq.conf"
    printf '[].\n' >"$dir/node$i/enabled_plugins"
    if [ -n "$dlx_confirm_timeout" ]; then
      printf '[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, %s}]}].\n' "$dlx_confirm_timeout" >"$dir/node$i/advanced.config"
    else
      printf '[].\n' >"$dir/node$i/advanced.config"
    fi
  done
  [ -z "$root" ] || return 0
  chown -R rabbitmq:rabbitmq "$dir"
  su rabbitmq -s /bin/sh -c "test -w '$dir/node1/mnesia'" || die "the rabbitmq user cannot write $dir: is a directory above it private?"
}

# launch starts node N detached; it returns before the node is up.
launch() {
  local n=$1 nd="$dir/node$1" args="" ip
  nd=${nd#"${root:-}"} # the path as the node sees it
  [ -z "$ticktime" ] || args="-kernel net_ticktime $ticktime"
  if [ -n "$netns" ]; then
    ip=$(addr "$n")
    ip=${ip//./,}
    args="$args -kernel inet_dist_use_interface {$ip} -kernel inet_dist_connect_options [{ip,{$ip}}]"
  fi
  local extra=()
  [ -z "$args" ] || extra=("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=$args")
  inns env "${extra[@]}" RABBITMQ_NODENAME="$(node "$n")" RABBITMQ_NODE_PORT="$(port "$n")" RABBITMQ_DIST_PORT="$(dist_port "$n")" \
    RABBITMQ_CONFIG_FILE="$nd/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$nd/advanced.config" RABBITMQ_MNESIA_BASE="$nd/mnesia" RABBITMQ_LOG_BASE="$nd/log" \
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
    for ((i = 1; i <= size; i++)); do
      [ -z "$netns" ] || heal "$i"
      ctl "$i" stop >/dev/null 2>&1 || (kill_one "$i") 2>/dev/null || true
    done
    rm -rf "$dir"
  fi
  if [ -n "$netns" ] && [ -e "/run/netns/$netns" ]; then
    # What is left in the namespace is its epmd, started by the first node.
    local pid
    for pid in $(ip netns pids "$netns"); do
      [ "$(ps -o comm= -p "$pid" 2>/dev/null)" != epmd ] || kill "$pid" 2>/dev/null || true
    done
    ip netns del "$netns"
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

# partition cuts node N off: every packet from or to its address is
# dropped, so neither the other nodes nor its AMQP clients hear from it
# again, and nothing resets their connections. heal removes the filters.
partition() {
  load
  check_n "$1"
  [ -n "$netns" ] || die "partition needs SLUICE_CLUSTER_NETNS"
  local a
  a=$(addr "$1")
  ip netns exec "$netns" tc filter add dev lo parent 1: pref $((100 + $1)) protocol ip u32 match ip src "$a"/32 classid 1:1
  ip netns exec "$netns" tc filter add dev lo parent 1: pref $((100 + $1)) protocol ip u32 match ip dst "$a"/32 classid 1:1
}

heal() {
  load
  check_n "$1"
  [ -n "$netns" ] || die "heal needs SLUICE_CLUSTER_NETNS"
  ip netns exec "$netns" tc filter del dev lo parent 1: pref $((100 + $1)) 2>/dev/null || true
}

urls() {
  local i out=""
  for ((i = 1; i <= size; i++)); do out="$out${out:+,}amqp://guest:guest@$(addr "$i"):$(port "$i")/"; done
  echo "$out"
}

status() {
  load
  [ -f "$dir/cluster.env" ] || { echo "no cluster in $dir"; return 0; }
  local i up=""
  for ((i = 1; i <= size; i++)); do
    if running "$i"; then
      echo "$(node "$i") amqp $(addr "$i"):$(port "$i") running"
      up=${up:-$i}
    else
      echo "$(node "$i") amqp $(addr "$i"):$(port "$i") down"
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
  partition) [ $# -eq 1 ] || die "usage: partition N"; partition "$1" ;;
  heal) [ $# -eq 1 ] || die "usage: heal N"; heal "$1" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
