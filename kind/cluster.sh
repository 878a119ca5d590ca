#!/usr/bin/env bash
# A kind cluster (one node, or $KIND_NODES: a control plane and workers) with the operator
# installed by its Helm chart, idempotently.
#
#   kind/cluster.sh up     create (or reuse) the cluster, load our images, install the chart
#   kind/cluster.sh down   delete the cluster and its kubeconfig
#   kind/cluster.sh env    print `export KUBECONFIG=... TFDATA_TEST_KUBECONFIG=...`
#   kind/cluster.sh logs D `kind export logs` into directory D (node journal, pod logs)
#   kind/cluster.sh load IMAGE...  `kind load docker-image` into the cluster's nodes (an image of a
#                          user's a test builds; skipped when a node has it with the same ID)
#   kind/cluster.sh freeze NODE    `docker pause` a node: every process in it stops at once and its
#                          address goes silent, as in a kernel hang, a partition or a lost VM
#   kind/cluster.sh thaw NODE      `docker unpause` it: the node comes back as it was
#
# up:
#   1. the node image (kind/node-image.sh: the published one where it can be
#      pulled, else one built here from source);
#   2. `kind create cluster` (kind $KIND_VERSION) with kind/docker-shim first on
#      PATH: on hosts where `docker run --privileged` cannot work (a capability missing
#      from the bounding set) the shim passes the explicit equivalent; elsewhere it
#      changes nothing;
#   3. on a node image built here (no kindnetd), flannel (flannel.yaml) for the pod network
#      and kube-network-policies (network-policies.yaml) for NetworkPolicies, on every node;
#   4. `kind load docker-image` tfdata-operator:<version>, tfdata-server:<version>,
#      tfdata-hostile:<version>, the hostile tests' tenant image, and tfdata-trainer:<version>,
#      the multi-worker example's trainer image (images/images.sh builds them when missing);
#   5. metrics-server, built here from source (kind/metrics-server.sh), for the
#      HorizontalPodAutoscaler of `spec.autoscaling.metric: CPU`;
#   6. `helm upgrade --install` of charts/tfdata-operator (the CRD from its crds/) into
#      namespace tfdata-system with image.pullPolicy=Never, and waits for the operator.
# The kubeconfig is written to .local/kind-kubeconfig (.local/kind-<name>-kubeconfig for a
# cluster named otherwise).
#
# Settings (environment): TFDATA_KIND_CLUSTER (default tfdata), KIND_NODES (default 1; 3 is a
# control plane and two workers; the control plane takes pods too, as a one-node cluster's
# does, and runs the operator), TFDATA_CACHE. An existing cluster is reused only with the
# node count asked for.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

CLUSTER="${TFDATA_KIND_CLUSTER:-tfdata}"
NODES="${KIND_NODES:-1}"
[[ "$NODES" =~ ^[1-9]$ ]] || { echo "KIND_NODES must be a node count from 1 to 9, not '$NODES'" >&2; exit 2; }
# The default cluster's kubeconfig is .local/kind-kubeconfig; another's is named after it.
if [[ "$CLUSTER" == tfdata ]]; then KUBECONFIG_OUT="$REPO/.local/kind-kubeconfig"; else KUBECONFIG_OUT="$REPO/.local/kind-$CLUSTER-kubeconfig"; fi
NAMESPACE=tfdata-system
RELEASE=tfdata-operator
# One directory of this machine mounted in every node at SHARED_MOUNT: storage every node sees,
# as a ReadWriteMany volume (NFS, a cloud file store) is on a real cluster. The kind tests put a
# hostPath PersistentVolume on it for a snapshot's directory (tests/kind/test_kind_snapshots.py).
# Mode 1777: the servers run as uid 1000.
SHARED_DIR="$REPO/.local/kind-$CLUSTER-shared"
SHARED_MOUNT=/var/lib/tfdata-shared
KIND="$KIND_BIN/kind-$KIND_VERSION"

log() { printf '[kind-cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
elapsed() { local s=$(($(date +%s) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
# Polls until the object's condition is True; on timeout shows its status. Not `kubectl wait
# --for=condition=...`: that fails at once, instead of polling, on an object whose
# status.conditions is still null (a CRD the API server has not written a status to yet).
wait_condition() {  # resource condition seconds
  local deadline=$((SECONDS + $3)) jsonpath="{.status.conditions[?(@.type==\"$2\")].status}"
  until [[ "$(kubectl get "$1" -o jsonpath="$jsonpath" 2>/dev/null)" == True ]]; do
    ((SECONDS < deadline)) || die "$1 was not $2 after $3 s; its status: $(kubectl get "$1" -o jsonpath='{.status}' 2>&1)"
    sleep 1
  done
}

VERSION="$(sed -nE 's/^version = "([^"]+)"$/\1/p' "$REPO/operator/pyproject.toml" | head -n 1)"

# kind (and only kind) sees the shim as `docker`.
kind_() { PATH="$HERE/docker-shim:$PATH" "$KIND" "$@"; }

# The list first, then the search: `kind get clusters | grep -q` can fail under pipefail (SIGPIPE).
cluster_exists() { [[ -x "$KIND" ]] && grep -qxF "$CLUSTER" <<<"$(kind_ get clusters 2>/dev/null)"; }

up() {
  local started image k8sbin config
  started="$(date +%s)"
  eval "$("$REPO/images/docker-daemon.sh" up)"
  image="$("$HERE/node-image.sh" | tail -n 1)"
  "$HERE/build-binaries.sh" kind
  k8sbin="$("$REPO/devcluster/k8s-binaries.sh" | tail -n 1)"   # kubectl and helm
  export PATH="$k8sbin:$PATH"
  mkdir -p "$REPO/.local"

  if cluster_exists; then
    local have
    have="$(kind_ get nodes --name "$CLUSTER" | wc -l)"
    ((have == NODES)) || die "cluster $CLUSTER has $have nodes, not the $NODES asked for (KIND_NODES): delete it first (kind/cluster.sh down)"
    log "cluster $CLUSTER exists; reusing it"
    kind_ get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_OUT"
  else
    config="$REPO/.local/kind-$CLUSTER-config.yaml"
    mkdir -p -m 1777 "$SHARED_DIR"
    chmod 1777 "$SHARED_DIR"
    write_config "$image" >"$config"
    log "creating cluster $CLUSTER ($NODES node(s)) from $image"
    # Without a CNI no node becomes Ready: kind's own wait is for clusters with kindnetd.
    local wait=(--wait 5m)
    [[ "$image" != "$KIND_NODE_IMAGE_LOCAL" ]] || wait=()
    kind_ create cluster --name "$CLUSTER" --image "$image" --config "$config" \
      --kubeconfig "$KUBECONFIG_OUT" "${wait[@]}" >&2
  fi
  export KUBECONFIG="$KUBECONFIG_OUT"
  if [[ "$image" == "$KIND_NODE_IMAGE_LOCAL" ]]; then
    # No kindnetd in this image: flannel connects the pods, across nodes, and its
    # NetworkPolicy engine runs on its own.
    grep -qF "image: $FLANNEL_IMAGE" "$HERE/flannel.yaml" || die "flannel.yaml does not run $FLANNEL_IMAGE"
    kubectl apply -f "$HERE/flannel.yaml" >&2
    kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds --timeout=3m >&2
    kubectl wait --for=condition=Ready nodes --all --timeout=3m >&2
    grep -qF "image: $KNP_IMAGE" "$HERE/network-policies.yaml" || die "network-policies.yaml does not run $KNP_IMAGE"
    kubectl apply -f "$HERE/network-policies.yaml" >&2
    kubectl -n kube-system rollout status daemonset/kube-network-policies --timeout=3m >&2
    # It has no readiness probe: enforcing means its nftables table exists in every node.
    local i node
    for node in $(kind_ get nodes --name "$CLUSTER"); do
      for i in $(seq 1 120); do
        "$DOCKER" exec "$node" nft list table inet kube-network-policies >/dev/null 2>&1 && break
        ((i < 120)) || die "kube-network-policies wrote no nftables rules in $node in 120 s: $(kubectl -n kube-system logs daemonset/kube-network-policies --tail=20 2>&1)"
        sleep 1
      done
    done
  fi
  if ((NODES > 1)); then
    # The control plane takes pods too (kind removes its taint only in one-node clusters).
    kubectl taint nodes "$CLUSTER-control-plane" node-role.kubernetes.io/control-plane:NoSchedule- >&2 2>/dev/null || true
  fi

  local img
  # One `kind load` for all: one archive, in which tfdata-trainer's layers under its own are the server's.
  local images=("tfdata-operator:$VERSION" "tfdata-server:$VERSION" "tfdata-hostile:$VERSION" "tfdata-trainer:$VERSION")
  for img in "${images[@]}"; do
    "$DOCKER" image inspect "$img" >/dev/null 2>&1 || { "$REPO/images/images.sh" >&2; break; }
  done
  local t
  t="$(date +%s)"
  # kind skips an image the node already has with the same ID.
  kind_ load docker-image --name "$CLUSTER" "${images[@]}" >&2
  log "loaded ${images[*]} in $(elapsed "$t")"

  local metrics_server
  metrics_server="$("$HERE/metrics-server.sh" image | tail -n 1)"
  kind_ load docker-image --name "$CLUSTER" "$metrics_server" >&2
  "$HERE/metrics-server.sh" manifests | kubectl apply -f - >&2
  kubectl -n kube-system rollout status deployment/metrics-server --timeout=3m >&2
  # Available once the API server reaches it and it has scraped the kubelet.
  wait_condition apiservice/v1beta1.metrics.k8s.io Available 180

  helm upgrade --install "$RELEASE" "$REPO/charts/tfdata-operator" \
    --namespace "$NAMESPACE" --create-namespace \
    --set image.pullPolicy=Never \
    --set kueue.enabled=true \
    --set-string 'nodeSelector.kubernetes\.io/hostname'="$CLUSTER-control-plane" \
    --wait --timeout 5m >&2
  kubectl -n "$NAMESPACE" rollout status deployment --timeout=3m >&2
  # The default StorageClass's provisioner (dispatcher journals need it).
  kubectl -n local-path-storage rollout status deployment/local-path-provisioner --timeout=3m >&2
  wait_condition crd/tfdataservices.tfdata.dev Established 60
  log "cluster $CLUSTER is up with the operator ($(elapsed "$started")); KUBECONFIG=$KUBECONFIG_OUT"
}

# $NODES nodes: a control plane, then workers. With a node image built here (no kindnetd: see
# kind/README.md) kind's default CNI is off and `up` installs flannel (flannel.yaml) and
# kube-network-policies (network-policies.yaml); with the published image kind's own kindnetd
# runs.
write_config() {
  cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  # The built-here node keeps these inside itself (base/entrypoint).
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/16
EOF
  [[ "$1" != "$KIND_NODE_IMAGE_LOCAL" ]] || echo "  disableDefaultCNI: true"
  echo "nodes:"
  local n role
  for ((n = 0; n < NODES; n++)); do
    role=worker
    ((n > 0)) || role=control-plane
    printf -- '- role: %s\n  extraMounts:\n  - hostPath: %s\n    containerPath: %s\n' "$role" "$SHARED_DIR" "$SHARED_MOUNT"
  done
}

load() {  # image...
  local started
  started="$(date +%s)"
  eval "$("$REPO/images/docker-daemon.sh" env)"
  cluster_exists || die "no cluster $CLUSTER: run kind/cluster.sh up first"
  kind_ load docker-image --name "$CLUSTER" "$@" >&2
  log "loaded $* into $CLUSTER in $(elapsed "$started")"
}

# Never the control plane: the cluster's API server runs there.
freeze() {  # pause|unpause node
  eval "$("$REPO/images/docker-daemon.sh" env)"
  cluster_exists || die "no cluster $CLUSTER"
  local nodes paused
  # Listed first, then searched: `kind get nodes | grep -q` fails under pipefail when grep exits
  # before kind has written everything (SIGPIPE), as it did once in CI.
  nodes="$(kind_ get nodes --name "$CLUSTER")"
  grep -qxF "$2" <<<"$nodes" || die "no node $2 in cluster $CLUSTER: $(tr '\n' ' ' <<<"$nodes")"
  [[ "$2" != "$CLUSTER-control-plane" ]] || die "$2 runs the cluster's API server: freeze a worker node"
  # Idempotent: pausing a paused node, or resuming one that runs, does nothing.
  paused="$("$DOCKER" inspect -f '{{.State.Paused}}' "$2")"
  if [[ "$1" == pause && "$paused" == true ]] || [[ "$1" == unpause && "$paused" == false ]]; then
    log "node $2 is already ${1}d"
    return
  fi
  "$DOCKER" "$1" "$2" >/dev/null
  log "${1}d node $2"
}

down() {
  if cluster_exists; then
    log "deleting cluster $CLUSTER"
    kind_ delete cluster --name "$CLUSTER" >&2
  else
    log "no cluster $CLUSTER"
  fi
  rm -f "$KUBECONFIG_OUT"
  rm -rf "$SHARED_DIR"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  logs) kind_ export logs --name "$CLUSTER" "${2:?usage: $0 logs DIR}" >&2 ;;
  load)
    shift
    (($#)) || die "usage: $0 load IMAGE..."
    load "$@"
    ;;
  freeze) freeze pause "${2:?usage: $0 freeze NODE}" ;;
  thaw) freeze unpause "${2:?usage: $0 thaw NODE}" ;;
  env) printf 'export KUBECONFIG=%q TFDATA_TEST_KUBECONFIG=%q\n' "$KUBECONFIG_OUT" "$KUBECONFIG_OUT" ;;
  *)
    echo "usage: $0 [up|down|env|logs DIR|load IMAGE...|freeze NODE|thaw NODE]" >&2
    exit 2
    ;;
esac
