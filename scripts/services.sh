#!/usr/bin/env bash
# Makes PostgreSQL, RabbitMQ, Redis and MariaDB reachable on 127.0.0.1 for the tests:
# installs them from Debian's packages when missing, starts them when stopped,
# sets PostgreSQL to trust 127.0.0.1 and creates the database "test", then
# waits until each one answers; installs promtool (Debian's prometheus package, its
# server not started) for the alert-rule tests; starts a RabbitMQ 4.0 node
# on 127.0.0.1:5682 (scripts/rabbitmq4.sh); enables the plugin
# rabbitmq_consistent_hash_exchange on both (partitioned topologies). Idempotent; needs root for installs
# and starts.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name seconds command...
  local name=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "$name did not answer within ${secs}s"; return 1
    fi
    sleep 1
  done
}

die() { log "$*"; exit 1; }
# shellcheck source=scripts/apt.sh
. "$(dirname "$0")/apt.sh"
install() { apt_install "$@"; }

postgres() {
  command -v pg_ctlcluster >/dev/null && [ -n "$(ls /etc/postgresql 2>/dev/null)" ] || install postgresql
  local version; version=$(ls /etc/postgresql | sort -V | tail -n1)
  local hba="/etc/postgresql/$version/main/pg_hba.conf"
  if ! grep -Eq '^host[[:space:]]+all[[:space:]]+all[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' "$hba"; then
    log "PostgreSQL: trusting 127.0.0.1 and ::1 in $hba"
    as_root sed -ri 's/^(host[[:space:]]+all[[:space:]]+all[[:space:]]+(127\.0\.0\.1\/32|::1\/128)[[:space:]]+)[a-z0-9-]+/\1trust/' "$hba"
    grep -Eq '^host[[:space:]]+all[[:space:]]+all[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' "$hba" ||
      printf 'host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' | as_root tee -a "$hba" >/dev/null
    pg_isready -q -h 127.0.0.1 -p 5432 && as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload
  fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    log "starting PostgreSQL $version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  fi
  wait_for PostgreSQL 60 pg_isready -h 127.0.0.1 -p 5432
  # make test runs 3 test binaries at once, each with pools of its own: at
  # 4, they passed the default 100 connections ("too many clients").
  if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -tAc 'SHOW max_connections')" -lt 300 ]; then
    log "PostgreSQL: max_connections 300 (a restart)"
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'ALTER SYSTEM SET max_connections = 300'
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main restart
    wait_for PostgreSQL 60 pg_isready -h 127.0.0.1 -p 5432
  fi
  if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")" != 1 ]; then
    log "PostgreSQL: creating database test"
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test'
  fi
}

# The shared RabbitMQ's open-file limit: RabbitMQ 3.x keeps 90% of it, less
# a reserve, for sockets (file_handle_cache), and a connection past that
# waits in its handshake. At Debian's default of 1024 (832 sockets) a make
# test wedged the broker: 354 connections accepted and waiting for ever in
# file_handle_cache:obtain, every test that dialled it failing on "i/o
# timeout". The count RabbitMQ's docs recommend for production is 65536.
# A container may cap it lower (the hard limit): then the hard limit.
rabbitmq_nofile=$(ulimit -Hn 2>/dev/null || echo 65536)
if [ "$rabbitmq_nofile" = unlimited ] || [ "$rabbitmq_nofile" -gt 65536 ]; then rabbitmq_nofile=65536; fi
rabbitmq_pid() { cat /var/lib/rabbitmq/mnesia/rabbit@localhost.pid 2>/dev/null; }
rabbitmq_nofile_now() { local pid; pid=$(rabbitmq_pid) && [ -n "$pid" ] && awk '/^Max open files/ {print $4}' "/proc/$pid/limits" 2>/dev/null; }
# amqp_answers: the broker answers a protocol header with connection.start
# within 10 s (a wedged broker accepts the TCP connection and says nothing).
amqp_answers() { timeout 10 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672 && printf "AMQP\x00\x00\x09\x01" >&3 && head -c 1 <&3 >/dev/null' 2>/dev/null; }
# shellcheck source=scripts/rabbitmq-dlx.sh
. "$(dirname "$0")/rabbitmq-dlx.sh"
rabbitmq_dlx_timeout_now() { as_root timeout 30 rabbitmqctl -q eval "$dlx_eval" 2>/dev/null; }

rabbitmq() {
  command -v rabbitmq-server >/dev/null || install rabbitmq-server
  if port_open 5672; then
    local why=""
    if [ "$(rabbitmq_nofile_now)" != "" ] && [ "$(rabbitmq_nofile_now)" -lt "$rabbitmq_nofile" ]; then
      why="its open-file limit is $(rabbitmq_nofile_now), below $rabbitmq_nofile"
    elif ! amqp_answers; then
      why="it accepts connections but answers no AMQP handshake within 10 s"
    elif [ "$(rabbitmq_dlx_timeout_now)" != "{ok,$dlx_confirm_timeout}" ]; then
      why="its dead_letter_worker_publisher_confirm_timeout is not ${dlx_confirm_timeout} ms"
    fi
    if [ -n "$why" ]; then
      log "RabbitMQ: restarting it: $why"
      as_root timeout 60 rabbitmqctl stop >/dev/null 2>&1 || { local pid; pid=$(rabbitmq_pid) && [ -n "$pid" ] && as_root kill -9 "$pid"; }
      wait_for "RabbitMQ to stop" 60 bash -c '! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null'
    fi
  fi
  # rabbitmq-server switches to the rabbitmq user, which resets the
  # limits; rabbitmq-env.conf is sourced by the shell that starts the VM.
  if ! grep -qx "ulimit -n $rabbitmq_nofile" /etc/rabbitmq/rabbitmq-env.conf 2>/dev/null; then
    log "RabbitMQ: open files $rabbitmq_nofile (/etc/rabbitmq/rabbitmq-env.conf)"
    as_root sed -i '/^ulimit -n /d' /etc/rabbitmq/rabbitmq-env.conf 2>/dev/null || true
    echo "ulimit -n $rabbitmq_nofile" | as_root tee -a /etc/rabbitmq/rabbitmq-env.conf >/dev/null
  fi
  if [ "$(cat /etc/rabbitmq/advanced.config 2>/dev/null)" != "$dlx_advanced_config" ]; then
    [ ! -s /etc/rabbitmq/advanced.config ] || grep -q dead_letter_worker_publisher_confirm_timeout /etc/rabbitmq/advanced.config ||
      die "/etc/rabbitmq/advanced.config holds settings of its own: add {dead_letter_worker_publisher_confirm_timeout, $dlx_confirm_timeout} to its rabbit section, or move it away"
    log "RabbitMQ: dead_letter_worker_publisher_confirm_timeout $dlx_confirm_timeout ms (/etc/rabbitmq/advanced.config)"
    echo "$dlx_advanced_config" | as_root tee /etc/rabbitmq/advanced.config >/dev/null
  fi
  if ! port_open 5672; then
    if as_root timeout 30 rabbitmqctl -q ping >/dev/null 2>&1; then
      # Its node runs with the app stopped: a run killed between a
      # restart test's stop_app and start_app leaves it so, and a second
      # node of the same name cannot start.
      log "RabbitMQ: its node runs with the app stopped; starting the app"
      as_root timeout 120 rabbitmqctl start_app >/dev/null 2>&1 || true
    else
      log "starting RabbitMQ (open files: $rabbitmq_nofile)"
      as_root rabbitmq-server -detached || true
      as_root timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
    fi
  fi
  wait_for RabbitMQ 120 port_open 5672
  wait_for "RabbitMQ's AMQP handshake" 120 amqp_answers
  # Partitioned topologies (TopologyConfig.Partitions) declare an exchange of
  # type x-consistent-hash: enabled online, no restart; idempotent.
  if ! as_root rabbitmq-plugins -q list -e -m 2>/dev/null | grep -qx rabbitmq_consistent_hash_exchange; then
    log "RabbitMQ: enabling rabbitmq_consistent_hash_exchange"
    as_root rabbitmq-plugins enable rabbitmq_consistent_hash_exchange >/dev/null
  fi
}

redis() {
  command -v redis-server >/dev/null || install redis-server
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    log "starting Redis"
    as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no >/dev/null
  fi
  wait_for Redis 30 redis-cli -h 127.0.0.1 -p 6379 ping
}

mariadb() { # the third-party store example (examples/mariadbstore)
  command -v mariadbd >/dev/null || command -v mysqld >/dev/null || install mariadb-server
  if ! port_open 3306; then
    log "starting MariaDB"
    as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
    (as_root service mariadb start >/dev/null 2>&1 || (as_root mysqld_safe --bind-address=127.0.0.1 >/dev/null 2>&1 &)) || true
  fi
  wait_for MariaDB 60 port_open 3306
  wait_for MariaDB 60 mysql -uroot -h127.0.0.1 -e 'SELECT 1'
  mysql -uroot -h127.0.0.1 -e 'CREATE DATABASE IF NOT EXISTS test'
}

promtool_() { # checks docs/alerts.yml (examples/orders/alerts_test.go); Debian ships it with Prometheus
  command -v promtool >/dev/null && return
  # Installed for its promtool only: a policy-rc.d keeps the Prometheus server
  # it brings from starting (one already there is left as it is).
  local policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod +x /usr/sbin/policy-rc.d
    policy=1
  fi
  local rc=0
  install --no-install-recommends prometheus || rc=$?
  [ -z "$policy" ] || as_root rm -f /usr/sbin/policy-rc.d
  return "$rc"
}

command -v psql >/dev/null || install postgresql-client
promtool_
# Headless Chromium for the console's browser tests (cmd/sluice/console_test.go).
[ -x /usr/bin/chromium ] || install --no-install-recommends chromium
postgres
rabbitmq
redis
mariadb
# RabbitMQ 4.0 beside 3.10 (make test-rabbitmq4): built once into /var/cache/sluice.
bash "$(dirname "$0")/rabbitmq4.sh" start
log "PostgreSQL 127.0.0.1:5432 (db test), RabbitMQ 127.0.0.1:5672, Redis 127.0.0.1:6379, MariaDB 127.0.0.1:3306 (db test): ready"
