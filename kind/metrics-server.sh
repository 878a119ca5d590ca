#!/usr/bin/env bash
# metrics-server for the kind cluster, built here from source: what the HorizontalPodAutoscaler
# of `spec.autoscaling.metric: CPU` reads. `kind/cluster.sh up` installs it.
#
#   kind/metrics-server.sh image      build $MS_IMAGE (idempotent); prints its name last
#   kind/metrics-server.sh manifests  print the manifests to apply: upstream's release
#                                          overlay, with --kubelet-insecure-tls and pullPolicy Never
#
# Kept out of the node image and out of versions.sh (whose contents name the node image, so
# any change there rebuilds it): it is an ordinary Deployment, loaded like our own images.
# The Go module proxy serves sigs.k8s.io/metrics-server, but the checksum database it relays
# answers 404 for it, so the download skips that lookup (GONOSUMDB, this module only) and the
# hash is checked against MS_MODULE_SUM (what `go mod download -json` reports as "Sum")
# instead; its dependencies are checked by its own go.sum as usual. kind's kubelets serve
# self-signed certificates, hence --kubelet-insecure-tls (what upstream's test overlay does).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

MS_VERSION="v0.8.0"
MS_MODULE="sigs.k8s.io/metrics-server"
MS_MODULE_SUM="h1:Zlsi3sBWEtFKCD3+xSysThvXyLQ363rUAlqpnsY5JwI="
MS_IMAGE="registry.k8s.io/metrics-server/metrics-server:$MS_VERSION"
OUT="$KIND_CACHE/metrics-server-$MS_VERSION"
LABEL="dev.tfdata.kind.metrics-server-sum"

log() { printf '[metrics-server %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
export GOFLAGS="-trimpath -buildvcs=false -modcacherw -gcflags=all=-dwarf=false" GONOSUMDB="$MS_MODULE"
export GOMODCACHE="$GO_CACHE_DIR/mod" GOCACHE="$GO_CACHE_DIR/build"

# The module's source directory, after checking its hash against the pin.
module_dir() {
  local json sum
  json="$(go mod download -json "$MS_MODULE@$MS_VERSION")" || die "go mod download $MS_MODULE@$MS_VERSION failed: $json"
  sum="$(sed -nE 's/^\s*"Sum": "(.*)",?$/\1/p' <<<"$json")"
  [[ "$sum" == "$MS_MODULE_SUM" ]] || die "$MS_MODULE@$MS_VERSION has hash '$sum', pinned: $MS_MODULE_SUM"
  sed -nE 's/^\s*"Dir": "(.*)",?$/\1/p' <<<"$json"
}

image() {
  eval "$("$REPO/images/docker-daemon.sh" up)"
  if [[ "$("$DOCKER" image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$MS_IMAGE" 2>/dev/null)" == "$MS_MODULE_SUM" ]]; then
    echo "$MS_IMAGE"
    return
  fi
  local dir started
  dir="$(module_dir)"
  mkdir -p "$OUT"
  if [[ ! -x "$OUT/metrics-server" ]]; then
    started="$(date +%s)"
    log "building $MS_MODULE $MS_VERSION"
    # Its own main module, read-only (as its Makefile builds it); the version as its Makefile sets it.
    (cd "$dir" && go build -mod=readonly \
      -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=$MS_VERSION" \
      -o "$OUT/metrics-server.tmp" ./cmd/metrics-server)
    mv "$OUT/metrics-server.tmp" "$OUT/metrics-server"
    log "built in $(($(date +%s) - started))s"
  fi
  # Upstream's image is distroless/static with the binary at /; scratch is enough (the
  # Deployment mounts an emptyDir at /tmp for its certificates, and talks to nothing by name
  # that needs CA files other than the service account's).
  cat >"$OUT/Dockerfile" <<'EOF'
FROM scratch
COPY metrics-server /metrics-server
USER 65534
ENTRYPOINT ["/metrics-server"]
EOF
  "$DOCKER" build -q --label "$LABEL=$MS_MODULE_SUM" --label "dev.tfdata.kind.built-from=source" \
    --tag "$MS_IMAGE" "$OUT" >/dev/null
  log "built $MS_IMAGE"
  echo "$MS_IMAGE"
}

manifests() {
  local dir work
  dir="$(module_dir)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  cp -a "$dir/manifests" "$work/"
  chmod -R u+w "$work"
  cat >"$work/kustomization.yaml" <<'EOF'
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- manifests/overlays/release
patches:
- target: {group: apps, version: v1, kind: Deployment, name: metrics-server}
  patch: |
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --kubelet-insecure-tls
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: Never
EOF
  kubectl kustomize "$work"
}

case "${1:-image}" in
  image) image ;;
  manifests) manifests ;;
  *)
    echo "usage: $0 [image|manifests]" >&2
    exit 2
    ;;
esac
