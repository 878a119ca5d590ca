#!/usr/bin/env bash
# Provides the pinned kwok binary (Kubernetes SIG Scheduling's simulated kubelet,
# sigs.k8s.io/kwok/cmd/kwok; not kwokctl) in devcluster/k8s-binaries.sh's bin directory,
# built from the Go module proxy, idempotently. devcluster/k8s-binaries.sh calls it; it
# also runs by itself:
#
#   devcluster/kwok-binary.sh BIN_DIR
#
# The module's hash is checked against the pin below as well as against the Go
# checksum database, so a re-tagged release cannot slip in. A changed pin rebuilds.
set -euo pipefail

KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
# `go mod download -json sigs.k8s.io/kwok@v0.8.0` | .Sum
KWOK_MODULE_SUM="h1:OTIOTwgROqPMovcTwxICx2eYQ4AwLpSx5EpjbDKF4SQ="

BIN="${1:?usage: devcluster/kwok-binary.sh BIN_DIR}"
CACHE="${TFDATA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfdata-operator}"
GOCACHE_DIR="$CACHE/go"
STAMP="$BIN/.version-kwok"

log() { printf '[kwok-binary %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$BIN/kwok" && "$(cat "$STAMP" 2>/dev/null)" == "$KWOK_VERSION" ]]; then
  exit 0
fi
command -v go >/dev/null || { log "Go is required to build kwok $KWOK_VERSION from source"; exit 1; }

# The same Go caches as devcluster/k8s-binaries.sh: the Kubernetes client libraries are shared.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off
export GOFLAGS="-trimpath -buildvcs=false -modcacherw -mod=mod -gcflags=all=-dwarf=false"
export GOMODCACHE="$GOCACHE_DIR/mod" GOCACHE="$GOCACHE_DIR/build"
mkdir -p "$BIN" "$CACHE/build"

module=sigs.k8s.io/kwok
sum="$(cd "$CACHE/build" && go mod download -json "$module@$KWOK_VERSION" | sed -nE 's/^\s*"Sum": "(.*)",?$/\1/p')"
[[ "$sum" == "$KWOK_MODULE_SUM" ]] || { log "$module@$KWOK_VERSION has hash '$sum', pinned: $KWOK_MODULE_SUM"; exit 1; }

log "building kwok $KWOK_VERSION from the Go module proxy (cold: 5-15 minutes on 2 cores)"
# kwok's go.mod has no replace or exclude directives, so `go install module@version` builds it
# with exactly the dependencies its go.sum pins.
GOBIN="$CACHE/build/kwok-gobin" go install -ldflags "-s -w -X $module/pkg/consts.Version=$KWOK_VERSION" \
  "$module/cmd/kwok@$KWOK_VERSION"
install -m 0755 "$CACHE/build/kwok-gobin/kwok" "$BIN/kwok.tmp"
mv "$BIN/kwok.tmp" "$BIN/kwok"
echo "$KWOK_VERSION" >"$STAMP"
log "kwok ready: $("$BIN/kwok" --version 2>&1 | head -1)"
