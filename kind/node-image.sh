#!/usr/bin/env bash
# Provides the kind node image for Kubernetes $K8S_VERSION (kind/versions.sh) and
# prints its name on the last line of stdout; progress goes to stderr.
#
#   kind/node-image.sh           ensure the image (pull or build), print its name
#   kind/node-image.sh --print   print the name that would be used, do nothing
#   kind/node-image.sh --parts   where it would be built: its parts that share no compiled package
#                                with Kubernetes (`make test` builds them beside the dev binaries)
#
# Where the published node image can be pulled (users with internet, CI) it is used
# as is: $KIND_PUBLISHED_NODE_IMAGE. Otherwise the image is assembled here, offline
# but for the Go module proxy and the Debian mirror, the way kind's own
# `kind build node-image` does it (which cannot run here: it fetches six images from
# registries), as $KIND_NODE_IMAGE_LOCAL:
#
#   1. binaries (kind/build-binaries.sh): kubeadm, kubelet, kubectl and the control
#      plane, etcd, coredns, local-path-provisioner, pause, containerd, runc, CNI plugins,
#      kube-network-policies, flanneld and flannel's CNI plugin;
#   2. the base image ($KIND_BASE_IMAGE, kind/base/Dockerfile): kind v0.30.0's
#      images/base on the local Debian bookworm root filesystem;
#   3. the images the node runs, under exactly the names kubeadm and kind's manifests
#      use: registry.k8s.io/{kube-apiserver,kube-controller-manager,kube-scheduler,
#      kube-proxy}:$K8S_VERSION, etcd, coredns, pause, kind's local-path-provisioner
#      and local-path-helper, kube-network-policies and flannel (cluster.sh installs both);
#   4. the node: kind's buildImage steps: kubeadm/kubelet/kubectl in /usr/bin,
#      /kind/version, /kind/manifests/default-{cni,storage}.yaml (printed from kind's Go
#      sources), every image imported into containerd's k8s.io namespace, pinned;
#      `docker commit`.
#
# Idempotent: the node image carries a label with a hash of every input (versions,
# scripts, Dockerfiles, binaries); when it matches, nothing is done (a warm run takes
# about a second).
#
# Settings (environment): TFDATA_KIND_BUILD_NODE_IMAGE=1 builds even where the published
# image could be pulled; TFDATA_CACHE; DOCKER (the docker CLI).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

log() { printf '[kind-node-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
elapsed() { local s=$(($(date +%s) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

CHOICE_FILE="$KIND_CACHE/node-image"

if [[ "${1:-}" == "--print" ]]; then
  if [[ -s "$CHOICE_FILE" ]]; then cat "$CHOICE_FILE"; else echo "$KIND_NODE_IMAGE_LOCAL"; fi
  exit 0
fi

mkdir -p "$KIND_CACHE"
eval "$("$REPO/images/docker-daemon.sh" up)"
export DOCKER_BUILDKIT=1
have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }
label_of() { "$DOCKER" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }

# --- Users with internet: the published image ---------------------------------------

registry_reachable() {  # without waiting on a registry that cannot answer
  getent hosts registry-1.docker.io >/dev/null 2>&1 ||
    [[ -n "$("$DOCKER" info --format '{{range .RegistryConfig.Mirrors}}{{.}}{{end}}' 2>/dev/null)" ]]
}

if [[ "${TFDATA_KIND_BUILD_NODE_IMAGE:-}" != 1 ]]; then
  if have_image "$KIND_PUBLISHED_NODE_IMAGE" ||
    { registry_reachable && "$DOCKER" pull -q "$KIND_PUBLISHED_NODE_IMAGE" >&2; }; then
    log "using the published node image $KIND_PUBLISHED_NODE_IMAGE"
    echo "$KIND_PUBLISHED_NODE_IMAGE" >"$CHOICE_FILE"
    echo "$KIND_PUBLISHED_NODE_IMAGE"
    exit 0
  fi
  log "the published node image cannot be pulled here: building $KIND_NODE_IMAGE_LOCAL from source"
fi

if [[ "${1:-}" == "--parts" ]]; then
  exec "$HERE/build-binaries.sh" --not-kubernetes
fi

exec 7>"$KIND_CACHE/.node-image.lock"
flock -n 7 || { log "another node image build is running; waiting for it"; flock 7; }

started="$(date +%s)"
"$HERE/build-binaries.sh"
BIN="$KIND_PARTS/bin"

# --- Inputs and the warm path ----------------------------------------------------------

inputs_hash() {
  {
    cat "$HERE/versions.sh" "$HERE/node-image.sh" "$HERE/build-binaries.sh" \
      "$HERE/base/Dockerfile" "$HERE/base/entrypoint"
    "$DOCKER" image inspect --format '{{.Id}}' "$LOCAL_BASE_IMAGE"
    # Binaries: size and mtime (they are only rewritten by a build).
    find "$BIN" -type f -printf '%P %s %T@\n' | sort
  } | sha256sum | cut -c1-16
}

if ! have_image "$LOCAL_BASE_IMAGE"; then
  log "$LOCAL_BASE_IMAGE is missing: images/images.sh makes it (with the project's images)"
  "$REPO/images/images.sh" >&2
fi

HASH="$(inputs_hash)"
LABEL=dev.tfdata.kind.inputs
if [[ "$(label_of "$KIND_NODE_IMAGE_LOCAL" "$LABEL")" == "$HASH" ]]; then
  log "$KIND_NODE_IMAGE_LOCAL is up to date (inputs $HASH)"
  echo "$KIND_NODE_IMAGE_LOCAL" >"$CHOICE_FILE"
  echo "$KIND_NODE_IMAGE_LOCAL"
  exit 0
fi

# --- kind's sources: base files and the two manifests ----------------------------------

export GOTOOLCHAIN=local GOWORK=off GOFLAGS="-modcacherw" GOMODCACHE="$GO_CACHE_DIR/mod" GOCACHE="$GO_CACHE_DIR/build"
KIND_SRC="$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -nE 's/^\s*"Dir": "(.*)",?$/\1/p')"
[[ -d "$KIND_SRC/images/base/files" ]] || die "no kind sources for $KIND_VERSION"

CTX="$KIND_PARTS/context"
rm -rf "$CTX"
mkdir -p "$CTX"

# The manifests are Go string constants in kind's pkg/build/nodeimage: print them with
# those very files compiled into a two-line program.
manifests="$CTX/manifests"
mkdir -p "$manifests/gen"
for f in const_cni.go const_storage.go; do
  sed 's/^package nodeimage$/package main/' "$KIND_SRC/pkg/build/nodeimage/$f" >"$manifests/gen/$f"
done
cat >"$manifests/gen/main.go" <<'EOF'
package main

import (
	"fmt"
	"os"
)

func main() {
	if os.Args[1] == "cni" {
		fmt.Print(defaultCNIManifest)
	} else {
		fmt.Print(defaultStorageManifest)
	}
}
EOF
printf 'module tfdata.dev/kindmanifests\n\ngo 1.22\n' >"$manifests/gen/go.mod"
(cd "$manifests/gen" && go run . cni >"$manifests/default-cni.yaml" && go run . storage >"$manifests/default-storage.yaml")
grep -q "$KINDNETD_IMAGE" "$manifests/default-cni.yaml" || die "kind's CNI manifest does not name $KINDNETD_IMAGE"
grep -q "$LPP_IMAGE" "$manifests/default-storage.yaml" || die "kind's storage manifest does not name $LPP_IMAGE"
grep -q "$LPP_HELPER_IMAGE" "$manifests/default-storage.yaml" || die "kind's storage manifest does not name $LPP_HELPER_IMAGE"

# --- 2. the base image --------------------------------------------------------------

BASE_HASH="$(cat "$HERE/base/Dockerfile" "$HERE/base/entrypoint" <("$DOCKER" image inspect --format '{{.Id}}' "$LOCAL_BASE_IMAGE") \
  <(cd "$BIN" && sha256sum containerd ctr containerd-shim-runc-v2 runc cni/*) | sha256sum | cut -c1-16)"
if [[ "$(label_of "$KIND_BASE_IMAGE" "$LABEL")" != "$BASE_HASH" ]]; then
  log "building the base image $KIND_BASE_IMAGE (Debian packages from the mirror: a few minutes)"
  base_ctx="$CTX/base"
  mkdir -p "$base_ctx/bin/cni"
  cp -a "$KIND_SRC/images/base/files" "$base_ctx/files"
  chmod -R u+w "$base_ctx/files"
  cp "$HERE/base/Dockerfile" "$HERE/base/entrypoint" "$base_ctx/"
  cp "$BIN/containerd" "$BIN/ctr" "$BIN/containerd-shim-runc-v2" "$BIN/runc" "$base_ctx/bin/"
  cp "$BIN"/cni/* "$base_ctx/bin/cni/"
  "$DOCKER" build --progress=plain --build-arg "BASE_IMAGE=$LOCAL_BASE_IMAGE" \
    --label "$LABEL=$BASE_HASH" --tag "$KIND_BASE_IMAGE" "$base_ctx" >&2
fi

# --- 3. the images the node runs --------------------------------------------------------

IMAGES=()
image() {  # name dockerfile-text [files...]: build from a context holding those files
  local name="$1" text="$2" dir
  shift 2
  dir="$CTX/images/$(echo "$name" | tr '/:' '__')"
  mkdir -p "$dir"
  printf '%s\n' "$text" >"$dir/Dockerfile"
  local f
  for f in "$@"; do cp "$f" "$dir/"; done
  log "image $name"
  "$DOCKER" build -q --label "dev.tfdata.kind.built-from=source" --tag "$name" "$dir" >/dev/null
  IMAGES+=("$name")
}

static_image() {  # name binary: FROM scratch, the binary on PATH (kubeadm's static pods name the command)
  image "$1" "FROM scratch
COPY $2 /usr/local/bin/$2
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENTRYPOINT [\"/usr/local/bin/$2\"]" "$BIN/$2"
}

for b in kube-apiserver kube-controller-manager kube-scheduler; do
  static_image "registry.k8s.io/$b:$K8S_VERSION" "$b"
done
image "registry.k8s.io/etcd:$ETCD_IMAGE_TAG" "FROM scratch
COPY etcd etcdctl /usr/local/bin/
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENTRYPOINT [\"/usr/local/bin/etcd\"]" "$BIN/etcd" "$BIN/etcdctl"
image "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" "FROM scratch
COPY coredns /coredns
USER 65532:65532
EXPOSE 53 53/udp
ENTRYPOINT [\"/coredns\"]" "$BIN/coredns"
image "registry.k8s.io/pause:$PAUSE_TAG" "FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT [\"/pause\"]" "$BIN/pause"
# kube-proxy programs iptables/nftables and conntrack: Debian's tools. Both the node
# (kind's entrypoint picks the backend docker used) and this image default to nft on
# bookworm.
image "registry.k8s.io/kube-proxy:$K8S_VERSION" "FROM $LOCAL_BASE_IMAGE
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      iptables nftables conntrack ipset kmod ebtables && rm -rf /var/lib/apt/lists/*
COPY kube-proxy /usr/local/bin/kube-proxy
ENTRYPOINT [\"/usr/local/bin/kube-proxy\"]" "$BIN/kube-proxy"
static_image "$LPP_IMAGE" local-path-provisioner
# Where upstream runs it: /bin/netpol on a static base (nftables and nfqueue go through
# netlink; no tools needed).
image "$KNP_IMAGE" "FROM scratch
COPY kube-network-policies /bin/netpol
ENTRYPOINT [\"/bin/netpol\"]" "$BIN/kube-network-policies"
# flanneld sets routes and masquerading (iptables, or nftables when asked) and its
# DaemonSet's init container copies the CNI configuration with `cp`: a Debian base, the
# binary where upstream's image has it.
image "$FLANNEL_IMAGE" "FROM $LOCAL_BASE_IMAGE
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      iptables nftables && rm -rf /var/lib/apt/lists/*
COPY flanneld /opt/bin/flanneld
ENTRYPOINT [\"/opt/bin/flanneld\"]" "$BIN/flanneld"
# The helper pod runs sh, mkdir and rm.
image "$LPP_HELPER_IMAGE" "FROM $LOCAL_BASE_IMAGE"

# kubeadm must ask for exactly what was built (pause aside: kind uses containerd's sandbox_image).
want="$("$BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null | grep -v /pause: | sort)"
have="$(printf '%s\n' "${IMAGES[@]}" | grep -E '^registry.k8s.io/' | grep -v -e /pause: -e "^$KNP_IMAGE\$" | sort)"
[[ "$want" == "$have" ]] || die "kubeadm expects:
$want
built:
$have"

# --- 4. the node ----------------------------------------------------------------------

log "assembling $KIND_NODE_IMAGE_LOCAL (kind's node build steps)"
tarball="$CTX/images.tar"
"$DOCKER" save -o "$tarball" "${IMAGES[@]}"
build_ctr="tfdata-kind-build-$$"
cleanup() { "$DOCKER" rm -f -v "$build_ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$DOCKER" run -d --entrypoint=sleep --name "$build_ctr" --security-opt seccomp=unconfined \
  "$KIND_BASE_IMAGE" infinity >/dev/null
for b in kubeadm kubelet kubectl; do
  "$DOCKER" cp "$BIN/$b" "$build_ctr:/usr/bin/$b"
done
"$DOCKER" exec "$build_ctr" bash -c 'chown root:root /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl && chmod 0755 /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl && mkdir -p /kind/manifests'
"$DOCKER" exec -i "$build_ctr" cp /dev/stdin /kind/version < <(printf '%s' "$K8S_VERSION")
"$DOCKER" cp "$manifests/default-cni.yaml" "$build_ctr:/kind/manifests/default-cni.yaml"
"$DOCKER" cp "$manifests/default-storage.yaml" "$build_ctr:/kind/manifests/default-storage.yaml"
"$DOCKER" exec "$build_ctr" bash -c 'nohup containerd >/tmp/containerd.log 2>&1 & echo $! >/tmp/containerd.pid'
"$DOCKER" exec "$build_ctr" bash -c 'for i in $(seq 1 50); do [ -S /run/containerd/containerd.sock ] && ctr info >/dev/null 2>&1 && exit 0; sleep 0.2; done; cat /tmp/containerd.log; exit 1'
"$DOCKER" exec -i "$build_ctr" ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
  --all-platforms --no-unpack --digests - <"$tarball" >&2
imported="$("$DOCKER" exec "$build_ctr" ctr --namespace=k8s.io images list -q)"
for i in "${IMAGES[@]}"; do
  full="$i"
  [[ "$i" == */*/* || "$i" == registry.k8s.io/* ]] || full="docker.io/$i"
  grep -qxF "$full" <<<"$imported" || die "$full is not in the node's containerd after the import:
$imported"
done
# Stop containerd and wait until it has exited (`sleep`, PID 1 here, reaps nobody: a
# zombie counts as exited).
"$DOCKER" exec "$build_ctr" bash -c 'pid="$(cat /tmp/containerd.pid)"; kill "$pid"; for i in $(seq 1 100); do state="$(awk "{print \\$3}" /proc/$pid/stat 2>/dev/null || true)"; [[ -z "$state" || "$state" == Z ]] && exit 0; sleep 0.1; done; echo "containerd did not stop" >&2; exit 1'
"$DOCKER" exec "$build_ctr" rm -f /tmp/containerd.pid /tmp/containerd.log
"$DOCKER" commit \
  --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
  --change "LABEL $LABEL=$HASH" \
  "$build_ctr" "$KIND_NODE_IMAGE_LOCAL" >/dev/null
cleanup
trap - EXIT
rm -f "$tarball"
# A rebuild leaves the images it replaced untagged: drop ours (by their label).
"$DOCKER" image prune --force --filter "label=$LABEL" >/dev/null
log "built $KIND_NODE_IMAGE_LOCAL in $(elapsed "$started") ($("$DOCKER" image ls --format '{{.Size}}' "$KIND_NODE_IMAGE_LOCAL" | head -1)); images in its containerd:"
printf '  %s\n' "$imported" >&2
echo "$KIND_NODE_IMAGE_LOCAL" >"$CHOICE_FILE"
echo "$KIND_NODE_IMAGE_LOCAL"
