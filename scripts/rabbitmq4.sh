#!/usr/bin/env bash
# A RabbitMQ 4.0 node beside the machine's 3.10, for the tests that run on
# both (make test-rabbitmq4). Debian 12 carries RabbitMQ 3.10; Debian 13
# ("trixie") carries 4.0 with Erlang 27. This script builds a trixie
# directory with debootstrap (once: it is cached), and runs the 4.0 node
# from it with chroot, under a node name, ports and data of its own. It
# shares the host's network and epmd and never touches the 3.10 node
# (rabbit@<host> on 5672).
#
#   rabbitmq4.sh [start]       build the directory if missing, start the node if down, wait until it serves AMQP
#   rabbitmq4.sh build         only build the directory (if missing)
#   rabbitmq4.sh stop          stop the node cleanly (the directory is kept)
#   rabbitmq4.sh kill          kill -9 the node's Erlang VM (a crash)
#   rabbitmq4.sh status        running or down, and the version
#   rabbitmq4.sh ctl ARGS...   the directory's rabbitmqctl ARGS against the node
#   rabbitmq4.sh env           the test environment for the node, as shell assignments
#   rabbitmq4.sh url           the node's AMQP URL
#
# Environment:
#   SLUICE_RABBITMQ4_DIR        the trixie directory (default /var/cache/sluice/rabbitmq-4.0)
#   SLUICE_RABBITMQ4_NODE       node name (default rmq4@localhost)
#   SLUICE_RABBITMQ4_PORT       AMQP port on 127.0.0.1 (default 5682)
#   SLUICE_RABBITMQ4_DIST_PORT  Erlang distribution port (default 25682)
#   SLUICE_RABBITMQ4_STATE      the node's state directory inside the directory: its
#                               configuration, data, logs and pid file (default
#                               /var/lib/sluice-rmq4). A second node from the same
#                               directory needs its own node name, ports and state.
#   SLUICE_RABBITMQ4_MIRROR     Debian mirror for debootstrap (default http://deb.debian.org/debian);
#                               checked first: one that does not answer within 20 s fails the build at once
#   SLUICE_RABBITMQ4_TIMEOUT    seconds to wait for the node to start (default 120)
#   SLUICE_RABBITMQ_DLX_CONFIRM_TIMEOUT  the node's dead_letter_worker_publisher_confirm_timeout
#                               in milliseconds (default 10000; RabbitMQ's is 180000), through
#                               advanced.config: how soon a quorum queue's dead-letter worker
#                               sends again a copy a restarting broker refused (scripts/rabbitmq-dlx.sh)
# Needs root (debootstrap, mount, chroot). Idempotent.
set -euo pipefail

root=${SLUICE_RABBITMQ4_DIR:-/var/cache/sluice/rabbitmq-4.0}
node=${SLUICE_RABBITMQ4_NODE:-rmq4@localhost}
port=${SLUICE_RABBITMQ4_PORT:-5682}
dist_port=${SLUICE_RABBITMQ4_DIST_PORT:-25682}
mirror=${SLUICE_RABBITMQ4_MIRROR:-http://deb.debian.org/debian}
timeout=${SLUICE_RABBITMQ4_TIMEOUT:-120}
# The node's files, inside the directory (paths as the chroot sees them).
state=${SLUICE_RABBITMQ4_STATE:-/var/lib/sluice-rmq4}
# home holds the Erlang cookie every node of the directory and its
# rabbitmqctl share (internal/testenv's private nodes too): the same for
# every state directory.
home=/var/lib/sluice-rmq4
case $state in /* ) ;; *) echo "rabbitmq4: SLUICE_RABBITMQ4_STATE must be absolute, got $state" >&2; exit 2 ;; esac

log() { printf 'rabbitmq4: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# shellcheck source=scripts/apt.sh
. "$(dirname "$0")/apt.sh"

# shellcheck source=scripts/rabbitmq-dlx.sh
. "$(dirname "$0")/rabbitmq-dlx.sh"
case $port in 5672 | 4369 | 25672) die "port $port belongs to the 3.10 node or epmd" ;; esac

# inroot runs a command in the directory, with HOME where the node's Erlang
# cookie is (the node and its rabbitmqctl run as root there, so they share
# the cookie at $home/.erlang.cookie).
inroot() {
  as_root chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$home" LANG=C.UTF-8 "$@"
}
ctl() { inroot /usr/lib/rabbitmq/bin/rabbitmqctl -n "$node" "$@"; }
# plugins_ctl names the directories: the CLI would take the node's plugin
# path, whose first directory (/usr/lib/rabbitmq/plugins) does not exist here.
plugins_ctl() {
  local dir
  dir=$(cd "$root" && ls -d usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins | tail -n1)
  inroot /usr/lib/rabbitmq/bin/rabbitmq-plugins -q -n "$node" "$@" --plugins-dir "/$dir" --enabled-plugins-file "$state/enabled_plugins"
}
plugins=rabbitmq_consistent_hash_exchange
running() { ctl ping >/dev/null 2>&1; }

# mirror_answers checks that the mirror serves trixie's Release file
# within 20 s, before debootstrap, which would retry an unreachable mirror
# for many minutes.
mirror_answers() {
  local url="${mirror%/}/dists/trixie/Release"
  if command -v curl >/dev/null; then
    curl -fsS --max-time 20 -o /dev/null "$url" 2>&1
  elif command -v wget >/dev/null; then
    wget -q -T 20 -t 1 -O /dev/null "$url" 2>&1
  else
    # Plain HTTP by hand: the status line of a HEAD request.
    local rest host path status
    case $mirror in http://*) ;; *) echo "neither curl nor wget to check $mirror"; return 1 ;; esac
    rest=${url#http://} host=${rest%%/*} path=/${rest#*/}
    status=$(timeout 20 bash -c 'exec 3<>"/dev/tcp/${1%:*}/$( [ "${1#*:}" != "$1" ] && echo "${1#*:}" || echo 80)" &&
      printf "HEAD %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" "$2" "${1%:*}" >&3 && head -n1 <&3' _ "$host" "$path" 2>&1) || { echo "no answer: $status"; return 1; }
    case $status in *" 200"*) ;; *) echo "answered: $status"; return 1 ;; esac
  fi
}

# build makes the trixie directory, in a temporary directory moved into
# place at the end: a build cut short is never taken for a finished one.
build() {
  [ -x "$root/usr/lib/rabbitmq/bin/rabbitmq-server" ] && [ -f "$root/.sluice-built" ] && return
  command -v debootstrap >/dev/null || {
    log "installing debootstrap"
    apt_install debootstrap
  }
  local why
  why=$(mirror_answers) || die "the Debian mirror $mirror does not serve trixie (${why:-no answer within 20 s}): set SLUICE_RABBITMQ4_MIRROR to one that does"
  local tmp="$root.building"
  as_root umount "$tmp/proc" 2>/dev/null || true
  as_root rm -rf "$tmp"
  as_root mkdir -p "$(dirname "$root")"
  log "building a Debian 13 (trixie) directory with rabbitmq-server in $root (about a minute, ~370 MB)"
  local out
  out=$(mktemp)
  # Bounded: a mirror that stops answering midway fails the build, not
  # make services, after 15 minutes (a build takes about one).
  if ! as_root timeout 900 debootstrap --variant=minbase --include=rabbitmq-server trixie "$tmp" "$mirror" >"$out" 2>&1; then
    tail -n 20 "$out" >&2
    rm -f "$out"
    die "debootstrap of trixie with rabbitmq-server from $mirror failed (its last lines above): set SLUICE_RABBITMQ4_MIRROR to another mirror"
  fi
  rm -f "$out"
  [ -x "$tmp/usr/lib/rabbitmq/bin/rabbitmq-server" ] || die "debootstrap gave no rabbitmq-server in $tmp"
  as_root touch "$tmp/.sluice-built"
  as_root rm -rf "$root"
  as_root mv "$tmp" "$root"
}

# configure writes the node's configuration (every start: a change of port
# here applies on the next start).
configure() {
  as_root mkdir -p "$root$state/mnesia" "$root$state/log"
  # What 4.3 removed is refused here as 4.3 refuses it (transient
  # non-exclusive queues, global QoS), so the tests on 4.0 catch its use.
  printf 'listeners.tcp.default = 127.0.0.1:%s\nloopback_users.guest = true\n%s\n%s\n' "$port" \
    'deprecated_features.permit.transient_nonexcl_queues = false' 'deprecated_features.permit.global_qos = false' |
    as_root tee "$root$state/rabbitmq.conf" >/dev/null
  echo "$dlx_advanced_config" | as_root tee "$root$state/advanced.config" >/dev/null
  # The consistent-hash exchange, for partitioned topologies
  # (TopologyConfig.Partitions); a node already running gets it in start.
  printf '[%s].\n' "$plugins" | as_root tee "$root$state/enabled_plugins" >/dev/null
  # The cookie the node and its rabbitmqctl share, written before either
  # runs (else both would race to create it).
  as_root mkdir -p "$root$home"
  if [ ! -s "$root$home/.erlang.cookie" ]; then
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F | as_root tee "$root$home/.erlang.cookie" >/dev/null
    as_root chmod 400 "$root$home/.erlang.cookie"
  fi
  # Erlang reads /proc (the VM's scheduler count, memory), rabbitmqctl /dev.
  mountpoint -q "$root/proc" || as_root mount --bind /proc "$root/proc"
}

launch() {
  log "starting RabbitMQ 4.0 node $node on 127.0.0.1:$port"
  : >"$root$state/stdout.log"
  # setsid: the node outlives this script and make; its output goes to a
  # file in its state directory.
  as_root setsid chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$home" LANG=C.UTF-8 \
    RABBITMQ_NODENAME="$node" RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT="$dist_port" \
    RABBITMQ_CONFIG_FILE="$state/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$state/advanced.config" RABBITMQ_MNESIA_BASE="$state/mnesia" \
    RABBITMQ_LOG_BASE="$state/log" RABBITMQ_ENABLED_PLUGINS_FILE="$state/enabled_plugins" \
    RABBITMQ_PID_FILE="$state/pid" \
    /usr/lib/rabbitmq/bin/rabbitmq-server >"$root$state/stdout.log" 2>&1 </dev/null &
  launched=$!
}

# boot_log prints the warning and error lines of the node's last boot.
boot_log() {
  grep -E '\[(error|warning)\]|BOOT FAILED|Error during startup' "$root$state/stdout.log" 2>/dev/null | tail -n 30 >&2 ||
    tail -n 30 "$root$state/stdout.log" >&2 2>/dev/null || true
}

# await waits until the node has booted and serves AMQP: await_startup fails
# at once until the node has registered with epmd, hence the retries. A
# node whose VM exits while booting is reported at once with its log
# lines; one that RabbitMQ 4.0 refused to boot with
# failed_to_deny_deprecated_features is started again, up to 5 times: its
# boot-time check of the feature this node denies (configure) raced
# Mnesia's table load — the check runs right after mnesia:start() and a
# table not loaded yet counts as the feature in use (internal/testenv's
# StartApp has the details). Each start is a new draw of that race.
await() {
  local deadline=$((SECONDS + timeout)) attempt=1
  # The VM's exit is checked before each rabbitmqctl (which boots a VM of
  # its own: seconds on a loaded machine).
  until { [ -z "${launched:-}" ] || kill -0 "$launched" 2>/dev/null; } && ctl await_startup --timeout 10 >/dev/null 2>&1 && port_open "$port"; do
    if [ -n "${launched:-}" ] && ! kill -0 "$launched" 2>/dev/null && ! running; then
      if grep -q failed_to_deny_deprecated_features "$root$state/stdout.log" 2>/dev/null && [ "$attempt" -lt 5 ]; then
        attempt=$((attempt + 1))
        log "RabbitMQ 4.0 refused to boot with failed_to_deny_deprecated_features (its check raced Mnesia's table load): starting it again, attempt $attempt"
        sleep "$attempt"
        launch
        continue
      fi
      boot_log
      die "RabbitMQ 4.0 node $node exited while booting (attempt $attempt; its log lines above; $root$state/log)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$root$state/stdout.log" "$root$state"/log/*.log >&2 2>/dev/null || true
      die "RabbitMQ 4.0 node $node did not serve 127.0.0.1:$port within ${timeout}s (logs above; $root$state/log)"
    fi
    sleep 1
  done
  [ "$attempt" -eq 1 ] || log "node $node booted on attempt $attempt"
}

start() {
  build
  if running && port_open "$port" && [ "$(dlx_timeout_now)" != "{ok,$dlx_confirm_timeout}" ]; then
    log "restarting $node: its dead_letter_worker_publisher_confirm_timeout is not $dlx_confirm_timeout ms"
    ctl stop >/dev/null
    local deadline=$((SECONDS + 60))
    while port_open "$port"; do
      [ "$SECONDS" -lt "$deadline" ] || die "node $node still serves 127.0.0.1:$port 60 s after rabbitmqctl stop"
      sleep 1
    done
  fi
  if running && port_open "$port"; then
    enable_plugins
    return
  fi
  if port_open "$port" && ! running; then
    die "127.0.0.1:$port is taken by something other than node $node: set SLUICE_RABBITMQ4_PORT"
  fi
  configure
  running || launch
  await
  log "RabbitMQ $(version) node $node: amqp://guest:guest@127.0.0.1:$port/"
}

# enable_plugins enables $plugins on the running node (started before
# configure wrote them): online, no restart; idempotent.
enable_plugins() {
  plugins_ctl list -e -m 2>/dev/null | grep -qx "$plugins" && return
  log "enabling $plugins on $node"
  plugins_ctl enable "$plugins" >/dev/null
}

dlx_timeout_now() { ctl -q eval "$dlx_eval" 2>/dev/null; }

version() { ctl -q eval 'rabbit_misc:version().' 2>/dev/null | tr -d '"' || echo 4.0; }

stop() {
  [ -f "$root/.sluice-built" ] || return 0
  running || return 0
  ctl stop >/dev/null
}

kill_node() {
  local pid
  pid=$(cat "$root$state/pid" 2>/dev/null) || die "node $node has no pid file: not started?"
  kill -0 "$pid" 2>/dev/null || die "node $node (pid $pid) is not running"
  as_root kill -9 "$pid"
  local deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "pid $pid survived kill -9 for 10s"
    sleep 0.05
  done
}

url() { echo "amqp://guest:guest@127.0.0.1:$port/"; }

cmd=${1:-start}
shift || true
case $cmd in
  start) start ;;
  build) build ;;
  stop) stop ;;
  kill) kill_node ;;
  status) if running; then echo "$node running, RabbitMQ $(version), $(url)"; else echo "$node down"; exit 3; fi ;;
  ctl) ctl "$@" ;;
  url) url ;;
  env)
    echo "SLUICE_TEST_AMQP_URL=$(url)"
    echo "SLUICE_TEST_RABBITMQ_ROOT=$root"
    echo "SLUICE_TEST_RABBITMQ_NODE=$node"
    ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
