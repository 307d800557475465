#!/usr/bin/env bash
# A Docker engine for `make images` / `make test-containers`, on a machine with none running.
#
#   deploy/engine/engine.sh start   install Debian's engine if missing, start dockerd if none answers
#   deploy/engine/engine.sh stop    stop the dockerd this script started (by PID) and clean up after it
#
# Only an engine this script started is ever stopped: its PID is in $STATE/dockerd.pid. An engine
# that was already running is used and left alone.
set -euo pipefail

STATE=$(realpath -m "${ENGINE_STATE:-build/engine}")
DATA_ROOT=${DOCKER_DATA_ROOT:-/var/lib/bento-bundle-docker}
# bentoml sets DOCKER_BUILDKIT=1 and calls the first `docker` on PATH; Debian's client (/usr/bin) has
# buildx, an older one in /usr/local/bin may not ("BuildKit is enabled but the buildx component is missing").
export PATH=/usr/bin:/usr/sbin:$PATH

die() { echo "error: $*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root to run: $* (no sudo here)"; fi
}

install_engine() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  [ ${#missing[@]} = 0 ] && return
  echo "installing ${missing[*]} (Debian packages) …"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
}

start() {
  install_engine
  if docker info >/dev/null 2>&1; then
    echo "a Docker engine is already running: using it"
    return
  fi
  mkdir -p "$STATE"
  # What dockerd changes on the host, to put back when it stops.
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward"
  (as_root iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}') >"$STATE/forward_policy" || true
  echo "starting dockerd (data root $DATA_ROOT, log $STATE/dockerd.log) …"
  as_root mkdir -p "$DATA_ROOT"
  # setsid: dockerd must outlive this shell (make runs each line in its own). dockerd writes its
  # own PID (--pidfile): `$!` would be the PID of a wrapper, and stopping that stops nothing.
  rm -f "$STATE/dockerd.pid"
  as_root setsid /usr/sbin/dockerd --data-root "$DATA_ROOT" --pidfile "$STATE/dockerd.pid" \
    >"$STATE/dockerd.log" 2>&1 < /dev/null &
  local launcher=$!
  for _ in $(seq 60); do
    if [ -s "$STATE/dockerd.pid" ] && docker info >/dev/null 2>&1; then
      echo "dockerd is up (PID $(cat "$STATE/dockerd.pid"))"
      return
    fi
    [ -s "$STATE/dockerd.pid" ] || kill -0 "$launcher" 2>/dev/null || break
    sleep 1
  done
  tail -20 "$STATE/dockerd.log" >&2 || true
  die "the Docker engine did not start (log: $STATE/dockerd.log)"
}

stop() {
  [ -f "$STATE/dockerd.pid" ] || { echo "no dockerd started by this script: nothing to stop"; return; }
  local pid
  pid=$(cat "$STATE/dockerd.pid")
  if kill -0 "$pid" 2>/dev/null; then
    echo "stopping dockerd (PID $pid) …"
    as_root kill -TERM "$pid"
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && as_root kill -KILL "$pid" && sleep 1
  fi
  kill -0 "$pid" 2>/dev/null && die "dockerd (PID $pid) is still running: left its network as it is"
  rm -f "$STATE/dockerd.pid"
  # dockerd leaves its bridge, its chains and its rules behind: remove what it made (only that),
  # and put back the forwarding settings found before it started.
  as_root ip link delete docker0 2>/dev/null || true
  as_root iptables -t nat -D POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE 2>/dev/null || true
  while read -r rule; do
    # shellcheck disable=SC2086
    as_root iptables ${rule/-A /-D } 2>/dev/null || true
  done < <(as_root iptables -S FORWARD 2>/dev/null | grep -i -- '-A FORWARD .*docker' || true)
  as_root iptables -t nat -D PREROUTING -m addrtype --dst-type LOCAL -j DOCKER 2>/dev/null || true
  as_root iptables -t nat -D OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER 2>/dev/null || true
  for table_chain in "nat DOCKER" "filter DOCKER" "filter DOCKER-USER" \
    "filter DOCKER-ISOLATION-STAGE-1" "filter DOCKER-ISOLATION-STAGE-2"; do
    set -- $table_chain
    as_root iptables -t "$1" -F "$2" 2>/dev/null && as_root iptables -t "$1" -X "$2" 2>/dev/null || true
  done
  [ -s "$STATE/forward_policy" ] && as_root iptables -P FORWARD "$(cat "$STATE/forward_policy")" 2>/dev/null || true
  [ -s "$STATE/ip_forward" ] && as_root sh -c "cat $STATE/ip_forward > /proc/sys/net/ipv4/ip_forward" 2>/dev/null || true
  echo "dockerd stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop" ;;
esac
