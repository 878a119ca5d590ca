#!/usr/bin/env bash
# Builds the two images, and the kind tier's hostile tenant and trainer images, idempotently:
#
#   tfdata-operator:<version>   images/operator/Dockerfile (the operator; no TensorFlow)
#   tfdata-server:<version>     images/server/Dockerfile   (dispatcher/worker; pinned TensorFlow)
#   tfdata-hostile:<version>    images/hostile/Dockerfile  (a tenant's tfdata-server that attacks the
#                               operator: tests/hostile/image; the kind tier's hostile tests run it)
#   tfdata-trainer:<version>    images/trainer/Dockerfile  (tfdata-server plus tf-keras: the kind
#                               tier runs examples/multi-worker/'s trainers on it)
#
# <version> is operator/pyproject.toml's, which the operator also uses for its default
# server image. Steps, each skipped when already done:
#
#   1. a Docker daemon that answers (images/docker-daemon.sh: installs Debian's docker.io and
#      starts a private dockerd when there is none; it keeps running for the next call);
#   2. the base image: $BASE_IMAGE if set; else python:3.11-slim-bookworm when it is local
#      or can be pulled; else a local one, tfdata-local/python:3.11-bookworm, made once
#      with debootstrap (Debian bookworm minbase + python3, venv, pip, CA certificates)
#      from the Debian mirror ($TFDATA_DEBIAN_MIRROR, default the one apt uses);
#   3. both images with BuildKit, passing that base as BASE_IMAGE. Layers are ordered so
#      TensorFlow's is reused until operator/pyproject.toml changes, and the wheels pip
#      downloads stay in a wheelhouse in BuildKit's cache: a rebuild with no change takes
#      a second, after a source change seconds, after a dependency change no re-download.
#
# `images/images.sh other DOCKERFILE TAG [CONTEXT]` builds another Dockerfile (its directory the
# context unless CONTEXT is given) the same way, on the same base (passed as BASE_IMAGE) and with
# the same CA bundle secret, and nothing else: an image of a user's the tests need
# (tests/kind/user-image/, whose context is the repository: it installs the trainer package).
#
# Settings (environment): BASE_IMAGE, TFDATA_LOCAL_BASE=1 (always the local base),
# TFDATA_CACHE (default ~/.cache/tfdata-operator), TFDATA_DEBIAN_MIRROR,
# TFDATA_BUILD_CA_BUNDLE (a CA bundle pip trusts during the build; default $PIP_CERT,
# $REQUESTS_CA_BUNDLE or $SSL_CERT_FILE when set), DOCKER (the docker CLI to use).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${TFDATA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfdata-operator}"
DEFAULT_BASE="python:3.11-slim-bookworm"
LOCAL_BASE="tfdata-local/python:3.11-bookworm"
SUITE="bookworm"

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
elapsed() { local s=$(($(date +%s) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

if [[ "${1:-}" == other ]] && ! [[ ($# == 3 || ($# == 4 && -d "${4:-}")) && -f "${2:-}" ]]; then
  die "usage: $0 [other DOCKERFILE TAG [CONTEXT]]"
fi

VERSION="$(sed -nE 's/^version = "([^"]+)"$/\1/p' "$REPO/operator/pyproject.toml" | head -n 1)"
[[ -n "$VERSION" ]] || die "no version in operator/pyproject.toml"

# --- 1. the daemon --------------------------------------------------------------

eval "$("$REPO/images/docker-daemon.sh" up)"
log "docker CLI $DOCKER ($("$DOCKER" version --format '{{.Client.Version}}')), daemon $("$DOCKER" version --format '{{.Server.Version}}')"

# BuildKit: a CLI from before 23.0 has it built in (DOCKER_BUILDKIT=1); a later one needs the buildx plugin.
client_major="$("$DOCKER" version --format '{{.Client.Version}}' | cut -d. -f1)"
if ((client_major < 23)); then
  export DOCKER_BUILDKIT=1
elif ! "$DOCKER" buildx version >/dev/null 2>&1; then
  die "$DOCKER (docker $client_major) needs the buildx plugin to build with BuildKit; install docker-buildx, or set DOCKER to a docker CLI before 23.0"
fi

# --- 2. the base image ------------------------------------------------------------

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

registry_reachable() {
  # Decided without contacting a registry that cannot be reached: Docker Hub's name must
  # resolve, or the daemon must have a registry mirror.
  getent hosts registry-1.docker.io >/dev/null 2>&1 ||
    [[ -n "$("$DOCKER" info --format '{{range .RegistryConfig.Mirrors}}{{.}}{{end}}' 2>/dev/null)" ]]
}

debian_mirror() {
  if [[ -n "${TFDATA_DEBIAN_MIRROR:-}" ]]; then
    echo "$TFDATA_DEBIAN_MIRROR"
    return
  fi
  local found
  found="$(grep -hoE '(URIs:|^deb)[[:space:]]+https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
    /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | awk '{print $2}' | head -n 1 || true)"
  echo "${found:-http://deb.debian.org/debian}"
}

unmount_under() {  # debootstrap mounts proc/sys in the target; never delete through a mount
  local dir="$1" m
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
}

build_local_base() {
  local rootfs="$CACHE/base-rootfs" mirror started
  started="$(date +%s)"
  mirror="$(debian_mirror)"
  [[ "$(id -u)" == 0 ]] || die "building $LOCAL_BASE with debootstrap needs root"
  if ! command -v debootstrap >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and there is no apt-get to install it"
    log "installing debootstrap"
    apt-get update -qq >&2 || log "apt-get update reported errors (continuing with what it fetched)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
  fi
  log "building the base image $LOCAL_BASE once: debootstrap $SUITE (minbase + python3) from $mirror (about 2 minutes)"
  unmount_under "$rootfs"
  rm -rf --one-file-system "$rootfs"
  mkdir -p "$rootfs"
  trap 'unmount_under "'"$rootfs"'"; rm -rf --one-file-system "'"$rootfs"'"' EXIT
  # The stages go to the terminal; every line, to $CACHE/debootstrap.log.
  set +e
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$rootfs" "$mirror" 2>&1 | tee "$CACHE/debootstrap.log" |
    grep --line-buffered -E '^(E:|W:|I: (Retrieving|Validating) [A-Z]|I: (Resolving|Checking|Installing|Unpacking|Configuring (required|the base)|Base system))' >&2
  local status="${PIPESTATUS[0]}"
  set -e
  if [[ "$status" != 0 || ! -x "$rootfs/usr/bin/python3" ]]; then
    tail -n 20 "$CACHE/debootstrap.log" >&2
    die "debootstrap failed (exit $status); full log: $CACHE/debootstrap.log"
  fi
  unmount_under "$rootfs"
  # What the official slim images leave out too: docs (but the copyright files), man pages,
  # translations, apt's downloaded lists and packages, logs. Later installs skip docs as well.
  (
    cd "$rootfs"
    rm -rf var/lib/apt/lists/* var/cache/apt/*.bin var/cache/apt/archives/*.deb var/cache/debconf/*-old \
      var/log/* usr/share/man/* usr/share/info/* usr/share/locale/* usr/share/lintian/*
    find usr/share/doc -mindepth 1 ! -name copyright ! -type d -delete
    find usr/share/doc -mindepth 1 -type d -empty -delete
    cat >etc/dpkg/dpkg.cfg.d/excludes <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    echo "deb $mirror $SUITE main" >etc/apt/sources.list
  )
  log "importing the root filesystem ($(du -sh --one-file-system "$rootfs" | cut -f1)) as $LOCAL_BASE"
  tar -C "$rootfs" --numeric-owner -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase + python3 (debootstrap), the local stand-in for $DEFAULT_BASE\"" \
    --message "debootstrap --variant=minbase $SUITE + python3, python3-venv, python3-pip, ca-certificates" \
    - "$LOCAL_BASE" >/dev/null
  unmount_under "$rootfs"
  rm -rf --one-file-system "$rootfs"
  trap - EXIT
  log "built $LOCAL_BASE in $(elapsed "$started")"
}

choose_base() {
  if [[ -n "${BASE_IMAGE:-}" ]]; then
    echo "$BASE_IMAGE"
  elif [[ "${TFDATA_LOCAL_BASE:-}" != 1 ]] && have_image "$DEFAULT_BASE"; then
    echo "$DEFAULT_BASE"
  elif have_image "$LOCAL_BASE"; then
    echo "$LOCAL_BASE"
  elif [[ "${TFDATA_LOCAL_BASE:-}" != 1 ]] && registry_reachable && "$DOCKER" pull -q "$DEFAULT_BASE" >&2; then
    echo "$DEFAULT_BASE"
  else
    [[ "${TFDATA_LOCAL_BASE:-}" == 1 ]] || log "$DEFAULT_BASE cannot be pulled here (no registry answers for it)"
    build_local_base
    echo "$LOCAL_BASE"
  fi
}

BASE="$(choose_base)"
log "base image: $BASE"

# --- 3. the images ---------------------------------------------------------------

ca_bundle="${TFDATA_BUILD_CA_BUNDLE:-${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}}"
secret_args=()
if [[ -n "$ca_bundle" && -s "$ca_bundle" ]]; then
  secret_args=(--secret "id=ca-bundle,src=$ca_bundle")
  log "pip in the build trusts $ca_bundle (a build secret; not stored in the images)"
fi

build_image() {  # dockerfile tag context [docker build args...]
  local file="$1" tag="$2" context="$3" started
  shift 3
  started="$(date +%s)"
  "$DOCKER" build \
    --file "$file" \
    --build-arg "BASE_IMAGE=$BASE" \
    "${secret_args[@]}" \
    "$@" \
    --progress=plain \
    --tag "$tag" \
    "$context"
  log "built $tag in $(elapsed "$started")"
}

table() {  # image...
  local image
  echo
  printf '%-40s %-20s %s\n' IMAGE ID SIZE
  for image in "$@"; do
    printf '%-40s %-20s %s\n' "$image" \
      "$("$DOCKER" image inspect --format '{{.Id}}' "$image" | cut -c8-19)" \
      "$("$DOCKER" image ls --format '{{.Size}}' "$image" | head -n 1)"
  done
}

build() {  # name
  build_image "$REPO/images/$1/Dockerfile" "tfdata-$1:$VERSION" "$REPO" --build-arg "VERSION=$VERSION"
}

if [[ "${1:-}" == other ]]; then
  build_image "$2" "$3" "${4:-$(dirname "$2")}"
  table "$BASE" "$3"
  exit 0
fi

log "building tfdata-operator:$VERSION"
build operator
if ! "$DOCKER" image inspect "tfdata-server:$VERSION" >/dev/null 2>&1; then
  log "building tfdata-server:$VERSION: a cold build downloads TensorFlow and its dependencies (~350 MB, TensorFlow alone 274 MB) from PyPI and installs ~1.3 GB; that takes a few minutes"
else
  log "building tfdata-server:$VERSION (TensorFlow's layer is reused unless operator/pyproject.toml changed)"
fi
build server
log "building tfdata-hostile:$VERSION (the kind tier's hostile tenant; seconds)"
build hostile
log "building tfdata-trainer:$VERSION (tfdata-server plus tf-keras, for the kind tier; seconds)"
build trainer

# A rebuild leaves the image it replaced untagged; drop those (ours only, by their label).
for name in operator server hostile trainer; do
  "$DOCKER" image prune --force --filter "label=org.opencontainers.image.title=tfdata-$name" >/dev/null
done

table "$BASE" "tfdata-operator:$VERSION" "tfdata-server:$VERSION" "tfdata-hostile:$VERSION" "tfdata-trainer:$VERSION"
