# shellcheck shell=bash
# apt_install PACKAGE...: installs packages from the host's apt sources,
# for scripts/services.sh and scripts/rabbitmq4.sh (sourced; they define
# log, die and as_root). Bounded: a source that does not answer fails
# within a minute or two, not after apt's default retries; a failure names
# the packages, apt's error lines and the sources.
apt_updated=""
apt_opts=(-o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20 -o Acquire::Retries=1)
apt_install() {
  local out rc=0
  out=$(mktemp)
  if [ -z "$apt_updated" ]; then
    log "apt-get update"
    as_root apt-get update -qq "${apt_opts[@]}" >"$out" 2>&1 || rc=$?
    apt_updated=1
    # apt-get update succeeds with a source that did not answer: say so.
    grep -E '^(W|E): (Failed to fetch|Some index files failed)' "$out" >&2 || true
  fi
  log "installing $*"
  [ "$rc" -ne 0 ] || as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_opts[@]}" "$@" >>"$out" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    grep -E '^(E|W):' "$out" | tail -n 10 >&2 || tail -n 10 "$out" >&2
    rm -f "$out"
    die "apt-get could not install $* (apt's errors above; the sources: $(apt_sources))"
  fi
  rm -f "$out"
}

# apt_sources lists the host's apt source URIs.
apt_sources() {
  grep -rhoE '^(deb(-src)?( +\[[^]]*\])?|URIs:) +[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d 2>/dev/null |
    awk '{print $NF}' | sort -u | head -n 5 | tr '\n' ' '
}
