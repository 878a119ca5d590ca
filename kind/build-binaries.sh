#!/usr/bin/env bash
# Builds, from the Go module proxy and the local C compiler, every binary the kind node
# image needs, at the versions pinned in kind/versions.sh, into $KIND_PARTS/bin
# (outside the repository). Idempotent: a binary that exists is not rebuilt, so a warm
# run costs nothing.
#
#   kind/build-binaries.sh [name...]     default: all
#   kind/build-binaries.sh --not-kubernetes all but kubernetes
#
# Names: kind kubernetes etcd coredns local-path-provisioner pause containerd runc
# cni-plugins kube-network-policies flannel.
#
# Go: the module and build caches are devcluster/k8s-binaries.sh's ($CACHE/go), so
# Kubernetes' dependencies are downloaded and compiled once for both; local-path-provisioner
# and kube-network-policies are built aligned with its Kubernetes build (devcluster/go-align.sh)
# after it, so the client libraries they share with Kubernetes are not compiled again, and
# etcd is its build, copied. Kubernetes is built from a throwaway main module (its go.mod
# replaces staging modules and `go install` refuses it); containerd and runc have `exclude` directives in go.mod,
# so they are built inside a writable copy of their module instead.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"
# shellcheck source=../devcluster/go-align.sh
. "$HERE/../devcluster/go-align.sh"

OUT="$KIND_PARTS/bin"
WORK="$KIND_CACHE/build"
mkdir -p "$OUT" "$WORK" "$KIND_BIN"

log() { printf '[kind-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

goenv() {
  export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
  export GOFLAGS="-trimpath -buildvcs=false -modcacherw -mod=mod -gcflags=all=-dwarf=false"
  export GOMODCACHE="$GO_CACHE_DIR/mod" GOCACHE="$GO_CACHE_DIR/build"
}
goenv

# Each component records the version it was built at; a changed pin rebuilds it.
stamped() { [[ "$(cat "$OUT/.version-$1" 2>/dev/null)" == "$2" ]]; }
stamp() { echo "$2" >"$OUT/.version-$1"; }

mod_dir() { go mod download -json "$1" | sed -nE 's/^\s*"Dir": "(.*)",?$/\1/p'; }
mod_gomod() { go mod download -json "$1" | sed -nE 's/^\s*"GoMod": "(.*)",?$/\1/p'; }

# In a module copy: its requirements moved to devcluster/k8s-binaries.sh's Kubernetes build's
# versions (devcluster/go-align.sh). Without that build (its binaries were downloaded), as is.
align() {  # component
  local dev_build="$CACHE/build/kubernetes-$K8S_VERSION"
  if ! kubernetes_modules "$dev_build" "$dev_build.modules" 2>/dev/null; then
    log "$1: no Kubernetes build to align with (its binaries were downloaded); built with its own versions"
    return 0
  fi
  log "$1: $(align_to_kubernetes "$dev_build.modules") modules moved to the Kubernetes build's versions"
}

# A writable copy of a module's source (for modules whose go.mod go install refuses).
module_copy() {  # module@version dest
  local src
  src="$(mod_dir "$1")"
  [[ -n "$src" && -d "$src" ]] || die "go mod download $1 failed"
  if [[ ! -f "$2/.complete" ]]; then
    rm -rf "$2"
    mkdir -p "$2"
    cp -a "$src/." "$2/"
    chmod -R u+w "$2"
    touch "$2/.complete"
  fi
}

# --- kind CLI ---------------------------------------------------------------------

build_kind() {
  [[ -x "$KIND_BIN/kind-$KIND_VERSION" ]] && return
  log "go install sigs.k8s.io/kind@$KIND_VERSION"
  GOBIN="$WORK/kind-gobin" go install "sigs.k8s.io/kind@$KIND_VERSION"
  install -m 0755 "$WORK/kind-gobin/kind" "$KIND_BIN/kind-$KIND_VERSION"
}

# --- Kubernetes: kubeadm, kubelet, kubectl, kube-proxy and the control plane ---------

K8S_BINARIES=(kubeadm kubelet kubectl kube-proxy kube-apiserver kube-controller-manager kube-scheduler)

# The control plane and kubectl of devcluster/k8s-binaries.sh, when it has built them at this
# version: the same build (CGO off, the same flags but the date), so they are copied, not linked
# again (four links of the largest binaries, about a minute of both cores).
copy_dev_control_plane() {
  local dev b v
  dev="$("$HERE/../devcluster/k8s-binaries.sh" --print)"
  for b in kubectl kube-apiserver kube-controller-manager kube-scheduler; do
    [[ -x "$OUT/$b" || ! -x "$dev/$b" ]] && continue
    if [[ $b == kubectl ]]; then v="$("$dev/$b" version --client 2>/dev/null)"; v="${v%%$'\n'*}"; else v="$("$dev/$b" --version 2>/dev/null)"; fi
    [[ "$v" == "Kubernetes $K8S_VERSION" || "$v" == "Client Version: $K8S_VERSION" ]] || continue
    log "$b $K8S_VERSION: the dev cluster's ($dev)"
    install -m 0755 "$dev/$b" "$OUT/$b"
  done
}

build_kubernetes() {
  local missing=() b
  copy_dev_control_plane
  for b in "${K8S_BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || missing+=("$b"); done
  ((${#missing[@]})) || return 0
  local dir="$WORK/kubernetes-$K8S_VERSION" major minor gomod date ldflags p
  major="$(echo "$K8S_VERSION" | sed -E 's/^v([0-9]+)\..*/\1/')"
  minor="$(echo "$K8S_VERSION" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"
  mkdir -p "$dir"
  log "building ${missing[*]} $K8S_VERSION from the Go module proxy (warm Go cache: minutes; cold: 15-40 min)"
  (
    cd "$dir"
    gomod="$(mod_gomod "k8s.io/kubernetes@$K8S_VERSION")"
    {
      printf 'module tfdata.dev/kindk8sbuild\n\ngo 1.24\n\nrequire k8s.io/kubernetes %s\n\n' "$K8S_VERSION"
      # The real go.mod requires every staging module at v0.0.0 and replaces it with
      # ./staging/...: replace each with its published v0.<minor>.<patch>.
      grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | sort -u |
        while read -r m; do echo "replace $m => $m v0.${K8S_VERSION#v1.}"; done
    } >go.mod
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for b in "${K8S_BINARIES[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"; done
      printf ')\n'
    } >tools.go
    go mod tidy -e >/dev/null 2>&1 || true
    go get "k8s.io/kubernetes@$K8S_VERSION" >&2
    date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    ldflags="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
      ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    for b in "${missing[@]}"; do
      log "go build $b $K8S_VERSION"
      go build -ldflags "$ldflags" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b"
      mv "$OUT/$b.tmp" "$OUT/$b"
    done
  )
}

# --- etcd ---------------------------------------------------------------------------

# devcluster/k8s-binaries.sh's etcd and etcdctl at this version (built after Kubernetes and aligned
# with it, or downloaded), provided by that script if it has not yet, and copied: one etcd build.
build_etcd() {
  local want="$ETCD_VERSION, the dev cluster's" dev b
  [[ -x "$OUT/etcd" && -x "$OUT/etcdctl" ]] && stamped etcd "$want" && return
  dev="$(ETCD_VERSION="$ETCD_VERSION" "$HERE/../devcluster/k8s-binaries.sh" | tail -n 1)"
  log "etcd $ETCD_VERSION: the dev cluster's ($dev)"
  for b in etcd etcdctl; do install -m 0755 "$dev/$b" "$OUT/$b"; done
  stamp etcd "$want"
}

# --- coredns, local-path-provisioner, CNI plugins ---------------------------------------
# Not built: kindnetd (sigs.k8s.io/kind/images/kindnetd is a nested module the module
# proxy does not serve) and crictl (sigs.k8s.io/cri-tools is not served either). See
# kind/README.md.

# CoreDNS without the plugins that serve zones from clouds and other stores (route53, azure,
# clouddns, etcd), forward over gRPC, trace or geoip: nothing in a kind cluster's Corefile
# (kubeadm's: errors, health, ready, kubernetes, prometheus, forward, cache, loop, reload,
# loadbalance) or in a test uses them, and their SDKs were most of the build (5 minutes cold).
# The way CoreDNS documents: the lines out of plugin.cfg, then `go generate`.
COREDNS_LEFT_OUT="geoip trace route53 azure clouddns etcd grpc"

build_coredns() {
  local want="$COREDNS_VERSION without $COREDNS_LEFT_OUT" p plugins
  [[ -x "$OUT/coredns" ]] && stamped coredns "$want" && return
  local dir="$WORK/coredns-$COREDNS_VERSION"
  log "building coredns $COREDNS_VERSION (without $COREDNS_LEFT_OUT)"
  module_copy "github.com/coredns/coredns@$COREDNS_VERSION" "$dir"
  (
    cd "$dir"
    for p in $COREDNS_LEFT_OUT; do sed -i "/^$p:/d" plugin.cfg; done
    go generate coredns.go
    go build -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$OUT/coredns.tmp" .
    plugins="$("$OUT/coredns.tmp" -plugins)"
    for p in $COREDNS_LEFT_OUT; do
      ! grep -qx "$p" <<<"$plugins" || die "coredns still has the $p plugin"
    done
    grep -qx kubernetes <<<"$plugins" || die "coredns has no kubernetes plugin"
  )
  mv "$OUT/coredns.tmp" "$OUT/coredns"
  stamp coredns "$want"
}

build_local_path_provisioner() {
  local want="$LPP_VERSION aligned"
  [[ -x "$OUT/local-path-provisioner" ]] && stamped local-path-provisioner "$want" && return
  local dir="$WORK/local-path-provisioner-$LPP_VERSION"
  log "building local-path-provisioner $LPP_VERSION"
  module_copy "github.com/rancher/local-path-provisioner@$LPP_VERSION" "$dir"
  (cd "$dir" && align local-path-provisioner && go build -ldflags "-s -w -X main.VERSION=$LPP_VERSION" -o "$OUT/local-path-provisioner.tmp" .)
  mv "$OUT/local-path-provisioner.tmp" "$OUT/local-path-provisioner"
  stamp local-path-provisioner "$want"
}

build_cni_plugins() {
  local p absent=0 want="$CNI_PLUGINS_VERSION+flannel-$FLANNEL_CNI_PLUGIN_VERSION"
  for p in host-local loopback ptp bridge portmap flannel; do [[ -x "$OUT/cni/$p" ]] || absent=1; done
  ((absent)) || ! stamped cni-plugins "$want" || return 0
  local dir="$WORK/cni-plugins-$CNI_PLUGINS_VERSION" fdir="$WORK/cni-plugins-$FLANNEL_CNI_PLUGIN_VERSION"
  log "building CNI plugins $CNI_PLUGINS_VERSION (host-local loopback ptp bridge portmap) and flannel's ($FLANNEL_CNI_PLUGIN_VERSION)"
  module_copy "github.com/containernetworking/plugins@$CNI_PLUGINS_VERSION" "$dir"
  module_copy "github.com/containernetworking/plugins@$FLANNEL_CNI_PLUGIN_VERSION" "$fdir"
  mkdir -p "$OUT/cni"
  (
    cd "$dir"
    local ld="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION"
    go build -ldflags "$ld" -o "$OUT/cni/host-local" ./plugins/ipam/host-local
    go build -ldflags "$ld" -o "$OUT/cni/loopback" ./plugins/main/loopback
    go build -ldflags "$ld" -o "$OUT/cni/ptp" ./plugins/main/ptp
    go build -ldflags "$ld" -o "$OUT/cni/bridge" ./plugins/main/bridge
    go build -ldflags "$ld" -o "$OUT/cni/portmap" ./plugins/meta/portmap
  )
  # flannel's CNI plugin (reads /run/flannel/subnet.env, delegates to bridge + host-local)
  # lived here until the plugins' v1.0.0; its own module (github.com/flannel-io/cni-plugin)
  # is not served by the module proxy. kind/README.md says more.
  (cd "$fdir" && go build -ldflags "-s -w" -o "$OUT/cni/flannel" ./plugins/meta/flannel)
  stamp cni-plugins "$want"
}

# flanneld, the pod network between nodes (kind/flannel.yaml runs it). Upstream builds it
# with cgo on amd64 (its UDP backend); main.go's import of the Tencent Cloud backend is
# dropped from the copy, as its SDK module is not served by the module proxy.
build_flannel() {
  [[ -x "$OUT/flanneld" ]] && stamped flannel "$FLANNEL_VERSION" && return
  local dir="$WORK/flannel-$FLANNEL_VERSION"
  log "building flanneld $FLANNEL_VERSION"
  module_copy "github.com/flannel-io/flannel@$FLANNEL_VERSION" "$dir"
  sed -i '\|"github.com/flannel-io/flannel/pkg/backend/tencentvpc"|d' "$dir/main.go"
  (cd "$dir" && CGO_ENABLED=1 go build -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" -o "$OUT/flanneld.tmp" .)
  mv "$OUT/flanneld.tmp" "$OUT/flanneld"
  stamp flannel "$FLANNEL_VERSION"
}

# kube-network-policies: the proxy serves the module but its checksum database has no
# entry, so the download skips that lookup (GONOSUMDB, this module only) and the hash is
# checked against the pin in versions.sh instead. Its dependencies are checked by its
# own go.sum as usual. kube-network-policies-xt-nfqueue.patch is applied to the copy: it
# queues packets through the xtables NFQUEUE target, as kernels without CONFIG_NFT_QUEUE
# (this workplace's) refuse nftables' own queue expression.
build_kube_network_policies() {
  local module="sigs.k8s.io/kube-network-policies" patch="$HERE/kube-network-policies-xt-nfqueue.patch" want sum dir
  want="$KNP_VERSION+$(sha256sum "$patch" | cut -c1-12) aligned"
  [[ -x "$OUT/kube-network-policies" ]] && stamped kube-network-policies "$want" && return
  dir="$WORK/kube-network-policies-${want% aligned}"
  log "building kube-network-policies $KNP_VERSION with $(basename "$patch")"
  sum="$(GONOSUMDB="$module" go mod download -json "$module@$KNP_VERSION" | sed -nE 's/^\s*"Sum": "(.*)",?$/\1/p')"
  [[ "$sum" == "$KNP_MODULE_SUM" ]] || die "$module@$KNP_VERSION has hash '$sum', pinned: $KNP_MODULE_SUM"
  GONOSUMDB="$module" module_copy "$module@$KNP_VERSION" "$dir"
  if [[ ! -f "$dir/.patched" ]]; then
    patch -d "$dir" -p1 --forward --quiet <"$patch" || die "$(basename "$patch") does not apply to $module@$KNP_VERSION"
    touch "$dir/.patched"
  fi
  (cd "$dir" && align kube-network-policies && go build -ldflags "-s -w" -o "$OUT/kube-network-policies.tmp" ./cmd)
  mv "$OUT/kube-network-policies.tmp" "$OUT/kube-network-policies"
  stamp kube-network-policies "$want"
}

# --- containerd and runc (their go.mod has `exclude`: build inside a copy) ------------

build_containerd() {
  [[ -x "$OUT/containerd" && -x "$OUT/ctr" && -x "$OUT/containerd-shim-runc-v2" ]] && stamped containerd "$CONTAINERD_VERSION" && return
  local dir="$WORK/containerd-$CONTAINERD_VERSION" pkg="github.com/containerd/containerd/v2"
  log "building containerd $CONTAINERD_VERSION"
  module_copy "$pkg@$CONTAINERD_VERSION" "$dir"
  (
    cd "$dir"
    local ld="-s -w -X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Revision=$CONTAINERD_VERSION -X $pkg/version.Package=github.com/containerd/containerd/v2"
    local tags="no_aufs no_zfs no_btrfs no_devmapper urfave_cli_no_docs"
    CGO_ENABLED=1 go build -tags "$tags" -ldflags "$ld" -o "$OUT/containerd.tmp" ./cmd/containerd
    CGO_ENABLED=1 go build -tags "$tags" -ldflags "$ld" -o "$OUT/ctr.tmp" ./cmd/ctr
    # The shim is static, as upstream builds it.
    CGO_ENABLED=0 go build -tags "$tags" -ldflags "$ld -extldflags -static" -o "$OUT/containerd-shim-runc-v2.tmp" ./cmd/containerd-shim-runc-v2
  )
  for b in containerd ctr containerd-shim-runc-v2; do mv "$OUT/$b.tmp" "$OUT/$b"; done
  stamp containerd "$CONTAINERD_VERSION"
}

build_runc() {
  [[ -x "$OUT/runc" ]] && stamped runc "$RUNC_VERSION" && return
  local dir="$WORK/runc-$RUNC_VERSION"
  if [[ ! -e /usr/include/seccomp.h ]]; then
    log "installing libseccomp-dev (runc links libseccomp)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libseccomp-dev >&2
  fi
  log "building runc $RUNC_VERSION"
  module_copy "github.com/opencontainers/runc@$RUNC_VERSION" "$dir"
  (
    cd "$dir"
    CGO_ENABLED=1 go build -tags "seccomp urfave_cli_no_docs" \
      -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -X main.gitCommit=$RUNC_VERSION" -o "$OUT/runc.tmp" .
  )
  mv "$OUT/runc.tmp" "$OUT/runc"
  stamp runc "$RUNC_VERSION"
}

# --- pause (C, static) ------------------------------------------------------------

build_pause() {
  [[ -x "$OUT/pause" ]] && return
  local src
  src="$(mod_dir "k8s.io/kubernetes@$K8S_VERSION")/build/pause/linux/pause.c"
  [[ -f "$src" ]] || die "no $src"
  log "building pause from $src (gcc -Os -static)"
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-tfdata" -o "$OUT/pause.tmp" "$src"
  strip "$OUT/pause.tmp"
  mv "$OUT/pause.tmp" "$OUT/pause"
}

ALL=(kind kubernetes etcd coredns local-path-provisioner pause containerd runc cni-plugins kube-network-policies flannel)
targets=("$@")
((${#targets[@]})) || targets=("${ALL[@]}")
# `--not-kubernetes`: every part that shares no compiled package with Kubernetes, which `make test`
# builds beside devcluster/k8s-binaries.sh; AFTER_KUBERNETES share its packages (one Go cache:
# compiled once), so they are built after it.
AFTER_KUBERNETES=" kubernetes etcd local-path-provisioner kube-network-policies "
if [[ "${targets[*]}" == --not-kubernetes ]]; then
  targets=()
  for t in "${ALL[@]}"; do [[ "$AFTER_KUBERNETES" == *" $t "* ]] || targets+=("$t"); done
fi

exec 8>"$KIND_CACHE/.binaries.lock"
flock -n 8 || { log "another build is running; waiting for it"; flock 8; }

for t in "${targets[@]}"; do
  case "$t" in
    kind) build_kind ;;
    kubernetes) build_kubernetes ;;
    etcd) build_etcd ;;
    coredns) build_coredns ;;
    local-path-provisioner) build_local_path_provisioner ;;
    pause) build_pause ;;
    containerd) build_containerd ;;
    runc) build_runc ;;
    cni-plugins) build_cni_plugins ;;
    kube-network-policies) build_kube_network_policies ;;
    flannel) build_flannel ;;
    *) die "unknown binary $t (known: ${ALL[*]})" ;;
  esac
done
log "binaries ready in $OUT"
