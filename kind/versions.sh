# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by the scripts
# Pinned versions of everything in the kind node image, and where it is cached.
# Sourced by kind/*.sh. Change a version here and `make kind-image` rebuilds what
# depends on it: the node image carries a label with a hash of this file, the scripts
# and the binaries.

KIND_VERSION="${KIND_VERSION:-v0.30.0}"
K8S_VERSION="${K8S_VERSION:-v1.34.4}"

# The node image users with internet pull instead of building one: kind v0.30.0's
# default (pkg/apis/config/defaults/image.go), Kubernetes v1.34.0. 1.34 is the newest
# minor whose kubelet still runs on cgroup v1 hosts.
KIND_PUBLISHED_NODE_IMAGE="${KIND_PUBLISHED_NODE_IMAGE:-kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a}"

# What `kubeadm config images list --kubernetes-version v1.34.4` names (checked by
# the build: it fails when kubeadm asks for something else).
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"         # registry.k8s.io/etcd:3.6.5-0
ETCD_IMAGE_TAG="${ETCD_IMAGE_TAG:-3.6.5-0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}"  # registry.k8s.io/coredns/coredns:v1.12.1
# kind replaces kubeadm's pause with containerd's sandbox_image (kind's base config).
PAUSE_TAG="${PAUSE_TAG:-3.10}"

# kind v0.30.0's own images (pkg/build/nodeimage/const_*.go) and their sources.
# kindnetd (the default CNI manifest's image) is not built here: README.md says why.
KINDNETD_IMAGE="docker.io/kindest/kindnetd:v20250512-df8de77b"
# In its place the built-here node runs kindnetd's NetworkPolicy engine on its own:
# kube-network-policies (SIG Network). The module proxy serves it, but the checksum
# database it relays has no entry for it, so the build checks this pinned module hash
# (what `go mod download -json` reports as "Sum") itself.
KNP_VERSION="${KNP_VERSION:-v0.7.0}"
KNP_MODULE_SUM="h1:UmQnkPKpJ/KJReIpOarEAt3kyZvF44jXp4AWPG9czkY="
KNP_IMAGE="registry.k8s.io/networking/kube-network-policies:$KNP_VERSION"
LPP_IMAGE="docker.io/kindest/local-path-provisioner:v20250214-acbabc1a"
LPP_VERSION="${LPP_VERSION:-v0.0.30}"           # github.com/rancher/local-path-provisioner
LPP_HELPER_IMAGE="docker.io/kindest/local-path-helper:v20241212-8ac705d0"

# The runtime in the node (kind v0.30.0's images/base/Dockerfile).
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.1.4}"
RUNC_VERSION="${RUNC_VERSION:-v1.3.0}"
CRICTL_VERSION="${CRICTL_VERSION:-v1.33.0}"          # not built here: README.md says why
CNI_PLUGINS_VERSION="${CNI_PLUGINS_VERSION:-v1.7.1}"
# The pod network between nodes: flannel (kindnetd is not built here: README.md says
# why), host-gw backend, and its CNI plugin from the CNI plugins' last release that had it.
FLANNEL_VERSION="${FLANNEL_VERSION:-v0.28.10}"
FLANNEL_IMAGE="ghcr.io/flannel-io/flannel:$FLANNEL_VERSION"
FLANNEL_CNI_PLUGIN_VERSION="${FLANNEL_CNI_PLUGIN_VERSION:-v0.9.1}"

# Local image names.
LOCAL_BASE_IMAGE="${LOCAL_BASE_IMAGE:-tfdata-local/python:3.11-bookworm}"   # images/images.sh makes it
KIND_BASE_IMAGE="tfdata-local/kind-base:$KIND_VERSION"
KIND_NODE_IMAGE_LOCAL="tfdata-local/kind-node:$K8S_VERSION"

CACHE="${TFDATA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfdata-operator}"
KIND_CACHE="$CACHE/kind"
KIND_BIN="$KIND_CACHE/bin"                                     # kind CLI
KIND_PARTS="$KIND_CACHE/parts-$KIND_VERSION-$K8S_VERSION"     # node binaries + image tarballs
GO_CACHE_DIR="$CACHE/go"                                       # shared with devcluster/k8s-binaries.sh
