#!/usr/bin/env bash
# Provides pinned etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl and helm in a cache directory outside the repository, idempotently, and
# kwok (the node-less tier's simulated kubelet) through devcluster/kwok-binary.sh.
#
# Where the official release downloads are reachable they are used (fast);
# otherwise every binary is built from the Go module proxy. Versions are stamped
# so `--version` tells the truth. Prints the bin directory on the last line of
# stdout; progress goes to stderr.
#
#   devcluster/k8s-binaries.sh            # ensure all binaries, print bin dir
#   devcluster/k8s-binaries.sh --print    # print bin dir only (no build)
#   devcluster/k8s-binaries.sh --ready    # exit 0 when every binary is there (no build, no wait)
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
# The etcd kubeadm names for Kubernetes v1.34 (kind/versions.sh's ETCD_VERSION): the kind node's
# etcd is this build, copied (kind/build-binaries.sh), not a second one.
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"

CACHE="${TFDATA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfdata-operator}"
BIN="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION/bin"
GOCACHE_DIR="$CACHE/go"
# shellcheck source=go-align.sh
. "$(dirname "${BASH_SOURCE[0]}")/go-align.sh"

log() { printf '[k8s-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ "${1:-}" == "--print" ]]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$BIN"
OS=linux
case "$(uname -m)" in
  x86_64) ARCH=amd64 ;;
  aarch64 | arm64) ARCH=arm64 ;;
  *) log "unsupported architecture $(uname -m)"; exit 1 ;;
esac

have() { [[ -x "$BIN/$1" ]]; }

# --- Official downloads (users with internet) -------------------------------

try_download() {  # url dest
  curl -fsSL --connect-timeout 5 --max-time 600 -o "$2.tmp" "$1" 2>/dev/null && mv "$2.tmp" "$2"
}

download_all() {
  local tmp
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    have "$b" && continue
    try_download "https://dl.k8s.io/release/$K8S_VERSION/bin/$OS/$ARCH/$b" "$tmp/$b" || return 1
    install -m 0755 "$tmp/$b" "$BIN/$b"
  done
  if ! have etcd || ! have etcdctl; then
    try_download "https://github.com/etcd-io/etcd/releases/download/$ETCD_VERSION/etcd-$ETCD_VERSION-$OS-$ARCH.tar.gz" "$tmp/etcd.tgz" || return 1
    tar -xzf "$tmp/etcd.tgz" -C "$tmp"
    install -m 0755 "$tmp/etcd-$ETCD_VERSION-$OS-$ARCH/etcd" "$BIN/etcd"
    install -m 0755 "$tmp/etcd-$ETCD_VERSION-$OS-$ARCH/etcdctl" "$BIN/etcdctl"
  fi
  if ! have helm; then
    try_download "https://get.helm.sh/helm-$HELM_VERSION-$OS-$ARCH.tar.gz" "$tmp/helm.tgz" || return 1
    tar -xzf "$tmp/helm.tgz" -C "$tmp"
    install -m 0755 "$tmp/$OS-$ARCH/helm" "$BIN/helm"
  fi
}

# --- Builds from the Go module proxy ----------------------------------------

# -gcflags=all=-dwarf=false: the compiler writes no debug information, which `-ldflags "-s -w"`
# strips from every binary anyway (Go's compile of local-path-provisioner from an empty cache, 4
# runs a side in turn on a shared machine, 2026-11-29: 217-337 CPU seconds, mean 265, without it;
# 273-401, mean 332, with it: a fifth less); every Go build of the project's scripts sets it.
goenv() {
  export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off
  export GOFLAGS="-trimpath -buildvcs=false -modcacherw -mod=mod -gcflags=all=-dwarf=false"
  export GOMODCACHE="$GOCACHE_DIR/mod" GOCACHE="$GOCACHE_DIR/build"
}

build_kubernetes() {
  local work minor major gomod
  work="$CACHE/build/kubernetes-$K8S_VERSION"
  mkdir -p "$work"
  major="$(echo "$K8S_VERSION" | sed -E 's/^v([0-9]+)\..*/\1/')"
  minor="$(echo "$K8S_VERSION" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"
  log "building Kubernetes $K8S_VERSION from the Go module proxy (cold: 15-40 min on 2 cores)"
  (
    cd "$work"
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -nE 's/.*"GoMod": "(.*)".*/\1/p')"
    cat > go.mod <<EOF
module tfdata.dev/k8sbuild

go 1.24

require k8s.io/kubernetes $K8S_VERSION
EOF
    # Every staging module is required at v0.0.0 and replaced by ./staging in
    # the real go.mod; replace each with its published v0.<minor>.<patch>.
    local staging_version="v0.${K8S_VERSION#v1.}"
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | sort -u |
      while read -r m; do echo "replace $m => $m $staging_version"; done >> go.mod
    cat > tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
    go mod tidy -e >&2 2>/dev/null || true
    go get "k8s.io/kubernetes@$K8S_VERSION" >&2
    local date ldflags
    date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    ldflags="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
      ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
      have "$b" && continue
      log "go build $b"
      go build -ldflags "$ldflags" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b"
      mv "$BIN/$b.tmp" "$BIN/$b"
    done
  )
}

# etcd and etcdctl (the kind node's etcd image holds both), after Kubernetes: aligned with its
# build (devcluster/go-align.sh), so the libraries both use (grpc, protobuf, otel, prometheus,
# etcd's client) are compiled once.
build_etcd() {
  local work="$CACHE/build/etcd-$ETCD_VERSION" modules="$CACHE/build/kubernetes-$K8S_VERSION.modules"
  mkdir -p "$work"
  log "building etcd $ETCD_VERSION from the Go module proxy"
  (
    cd "$work"
    printf 'module tfdata.dev/etcdbuild\n\ngo 1.24\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 %s\n\tgo.etcd.io/etcd/etcdctl/v3 %s\n)\n' \
      "$ETCD_VERSION" "$ETCD_VERSION" > go.mod
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "go.etcd.io/etcd/etcdctl/v3"\n\t_ "go.etcd.io/etcd/server/v3"\n)\n' > tools.go
    go mod tidy -e >&2 2>/dev/null || true
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION" >&2
    kubernetes_modules "$CACHE/build/kubernetes-$K8S_VERSION" "$modules"  # built just before
    log "etcd: $(align_to_kubernetes "$modules") modules moved to the Kubernetes build's versions"
    local ld="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION#v}"
    go build -ldflags "$ld" -o "$BIN/etcdctl.tmp" go.etcd.io/etcd/etcdctl/v3
    go build -ldflags "$ld" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$BIN/etcdctl.tmp" "$BIN/etcdctl"
    mv "$BIN/etcd.tmp" "$BIN/etcd"
  )
}

build_helm() {
  log "building helm $HELM_VERSION from the Go module proxy"
  local minor major
  major="$(echo "$K8S_VERSION" | sed -E 's/^v([0-9]+)\..*/\1/')"
  minor="$(echo "$K8S_VERSION" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $p.k8sVersionMajor=$major -X $p.k8sVersionMinor=$minor"
  done
  GOBIN="$CACHE/build/helm-bin" go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  install -m 0755 "$CACHE/build/helm-bin/helm" "$BIN/helm"
}

all_present() {
  for b in etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kubectl helm; do
    have "$b" || return 1
  done
}

if [[ "${1:-}" == "--ready" ]]; then
  all_present && have kwok
  exit
fi

# Two builds at once would fight over the same cache: the second waits for the first.
exec 9> "$CACHE/.lock"
flock -n 9 || { log "another build is running; waiting for it"; flock 9; }

if ! all_present; then
  if [[ "${TFDATA_NO_DOWNLOAD:-}" != "1" ]] && download_all; then
    log "downloaded official release binaries"
  else
    command -v go > /dev/null || { log "Go is required to build the binaries from source"; exit 1; }
    goenv
    # Kubernetes first: etcd's build is aligned with it, and the kind node's parts wait for it.
    build_kubernetes
    have etcd && have etcdctl || build_etcd
    have helm || build_helm
  fi
fi

# kwok is always built from source (its own script pins the module hash), under the same lock.
"$(dirname "${BASH_SOURCE[0]}")/kwok-binary.sh" "$BIN"

for b in etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kubectl helm kwok; do
  have "$b" || { log "missing $BIN/$b after build"; exit 1; }
done
log "binaries ready in $BIN ($("$BIN/kube-apiserver" --version), $("$BIN/etcd" --version | head -1), helm $("$BIN/helm" version --short))"
echo "$BIN"
