#!/usr/bin/env bash
# A reachable Docker daemon for building and testing the images, idempotently.
#
#   images/docker-daemon.sh [up]   make sure a daemon answers; print `export DOCKER=...` lines
#   images/docker-daemon.sh env    print those lines for a daemon that answers now (exit 1 if none)
#   images/docker-daemon.sh status say which daemon and CLI are used, and where the data lives
#   images/docker-daemon.sh down   stop the daemon this script started (its images stay)
#
# Any daemon that already answers is used as it is (Docker Desktop, a system service,
# $DOCKER_HOST). Only when none does, this script (as root) installs Debian's `docker.io`
# if `dockerd` is missing and starts a private `dockerd`:
#
#   socket     the default one, unix:///var/run/docker.sock, so `docker`, kind and the
#              image tests need no DOCKER_HOST and nothing ever starts a second daemon
#   data-root  $TFDATA_CACHE/docker/data-root (default ~/.cache/tfdata-operator/docker):
#              outside the repository, so images and BuildKit's pip cache outlive
#              `git clean` and daemon restarts
#   pidfile    $TFDATA_CACHE/docker/dockerd.pid   log  $TFDATA_CACHE/docker/dockerd.log
#
# It runs in its own session (setsid), so it outlives this script and the shell that ran
# it; the next invocation finds it answering and reuses it. Stop it with `down`.
#
# The CLI: when the `docker` on PATH and the daemon's own package disagree on the version
# (e.g. a newer static CLI without the buildx plugin next to Debian's 20.10 daemon),
# the CLI that matches the daemon is used. `DOCKER=/path/to/docker` overrides the choice.
set -euo pipefail

CACHE="${TFDATA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfdata-operator}"
STATE="$CACHE/docker"
PIDFILE="$STATE/dockerd.pid"
LOGFILE="$STATE/dockerd.log"
SOCKET="/var/run/docker.sock"
START_TIMEOUT="${TFDATA_DOCKERD_START_TIMEOUT:-90}"

log() { printf '[docker-daemon %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- Which CLI ------------------------------------------------------------------

client_version() { "$1" --version 2>/dev/null | sed -E 's/^Docker version ([^,]+),.*/\1/'; }  # no daemon needed
server_version() { timeout 20 "$1" version --format '{{.Server.Version}}' 2>/dev/null; }
answers() { [[ -n "$1" ]] && timeout 20 "$1" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

candidates() {  # every docker CLI on this machine, PATH's first
  local seen="" c
  for c in "$(command -v docker 2>/dev/null || true)" /usr/bin/docker /usr/local/bin/docker; do
    [[ -n "$c" && -x "$c" && " $seen " != *" $c "* ]] || continue
    seen="$seen $c"
    echo "$c"
  done
}

pick_cli() {  # prints the CLI to use: $DOCKER, else the one matching the daemon's version
  if [[ -n "${DOCKER:-}" ]]; then
    echo "$DOCKER"
    return
  fi
  local first="" want="" c
  for c in $(candidates); do
    [[ -z "$first" ]] && first="$c"
    if [[ -z "$want" ]]; then
      want="$(server_version "$c" || true)"
    fi
  done
  # No daemon answers yet: match the version of the dockerd we would start.
  if [[ -z "$want" ]] && command -v dockerd >/dev/null 2>&1; then
    want="$(dockerd --version 2>/dev/null | sed -E 's/^Docker version ([^,]+),.*/\1/')"
  fi
  if [[ -n "$want" ]]; then
    for c in $(candidates); do
      if [[ "$(client_version "$c")" == "$want" ]]; then
        echo "$c"
        return
      fi
    done
  fi
  echo "$first"
}

print_env() {
  printf 'export DOCKER=%q\n' "$1"
  if [[ -n "${DOCKER_HOST:-}" ]]; then
    printf 'export DOCKER_HOST=%q\n' "$DOCKER_HOST"
  fi
}

# --- Our daemon -----------------------------------------------------------------

our_pid() {  # the pid of the dockerd this script started, if it still runs
  local pid
  [[ -s "$PIDFILE" ]] || return 1
  pid="$(cat "$PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/comm" && "$(cat "/proc/$pid/comm")" == "dockerd" ]] || return 1
  echo "$pid"
}

install_docker() {
  command -v apt-get >/dev/null 2>&1 || die "no Docker daemon answers and there is no apt-get to install one: install Docker and start it"
  log "installing Debian's docker.io (dockerd, containerd, runc) with apt-get"
  # An unreachable third-party source must not stop the install from the Debian mirror.
  apt-get update -qq >&2 || log "apt-get update reported errors (continuing with what it fetched)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >&2
}

start_dockerd() {
  local pid
  mkdir -p "$STATE/data-root"
  if pid="$(our_pid)"; then
    log "dockerd (pid $pid) is running but does not answer yet; waiting for it"
  else
    log "starting dockerd: socket $SOCKET, data-root $STATE/data-root, log $LOGFILE"
    # --pidfile also keeps two of ours from running at once: dockerd refuses a live one.
    # It outlives its caller, so it must not keep the caller's other descriptors open: a
    # lock (`flock FILE make images`) or a pipe would be held for as long as dockerd runs.
    local fd inherited=()
    for fd in /proc/$$/fd/*; do
      fd="${fd##*/}"
      ((fd > 2)) && inherited+=("$fd")
    done
    (
      for fd in "${inherited[@]}"; do eval "exec $fd>&-" 2>/dev/null || true; done
      exec setsid dockerd \
        --host "unix://$SOCKET" \
        --data-root "$STATE/data-root" \
        --pidfile "$PIDFILE" \
        >>"$LOGFILE" 2>&1 </dev/null
    ) &
    disown || true
  fi
  local cli deadline=$((SECONDS + START_TIMEOUT))
  cli="$(pick_cli)"
  until answers "$cli"; do
    if ((SECONDS > deadline)); then
      log "dockerd did not answer within ${START_TIMEOUT}s; the end of $LOGFILE:"
      tail -n 30 "$LOGFILE" >&2 || true
      exit 1
    fi
    if ! our_pid >/dev/null && ((SECONDS > deadline - START_TIMEOUT + 5)); then
      log "dockerd exited during start; the end of $LOGFILE:"
      tail -n 30 "$LOGFILE" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
  log "dockerd is up (pid $(our_pid || echo '?'), version $(server_version "$cli"))"
}

up() {
  mkdir -p "$STATE"
  # Concurrent `make images` runs must not both start a daemon.
  exec 9>"$STATE/lock"
  flock 9
  local cli
  cli="$(pick_cli)"
  if ! answers "$cli"; then
    if [[ -n "${DOCKER_HOST:-}" ]]; then
      die "DOCKER_HOST=$DOCKER_HOST does not answer; start that daemon or unset DOCKER_HOST"
    fi
    [[ "$(id -u)" == 0 ]] || die "no Docker daemon answers; starting one needs root (run as root, or start Docker yourself)"
    command -v dockerd >/dev/null 2>&1 || install_docker
    start_dockerd
    cli="$(pick_cli)"
  fi
  local client server
  client="$(client_version "$cli")"
  server="$(server_version "$cli")"
  if [[ "$client" != "$server" ]]; then
    log "note: CLI $cli is $client, the daemon is $server (the API version is negotiated)"
  fi
  print_env "$cli"
}

case "${1:-up}" in
  up) up ;;
  env)
    cli="$(pick_cli)"
    answers "$cli" || { log "no Docker daemon answers; run images/docker-daemon.sh (or make images) first"; exit 1; }
    print_env "$cli"
    ;;
  status)
    cli="$(pick_cli)"
    if answers "$cli"; then
      echo "daemon:    $(server_version "$cli") at ${DOCKER_HOST:-unix://$SOCKET}"
      echo "CLI:       $cli ($(client_version "$cli"))"
      echo "data-root: $("$cli" info --format '{{.DockerRootDir}}' 2>/dev/null)"
      if pid="$(our_pid)"; then
        echo "started by this script: pid $pid, log $LOGFILE"
      else
        echo "not started by this script"
      fi
    else
      echo "no Docker daemon answers"
      exit 1
    fi
    ;;
  down)
    if ! pid="$(our_pid)"; then
      log "no dockerd started by this script is running"
      exit 0
    fi
    log "stopping dockerd (pid $pid); its data stays in $STATE/data-root"
    kill -TERM "$pid"
    # dockerd stops its containers first (10s each by default).
    for _ in $(seq 1 120); do
      [[ -d "/proc/$pid" ]] || { log "stopped"; exit 0; }
      sleep 0.5
    done
    die "dockerd (pid $pid) still runs after 60s; see $LOGFILE"
    ;;
  *)
    echo "usage: $0 [up|env|status|down]" >&2
    exit 2
    ;;
esac
