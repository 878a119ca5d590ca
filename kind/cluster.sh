#!/usr/bin/env bash
# A one-node kind cluster with the operator installed by its Helm chart, idempotently.
#
#   kind/cluster.sh up     create (or reuse) the cluster, load our images, install the chart
#   kind/cluster.sh down   delete the cluster and its kubeconfig
#   kind/cluster.sh env    print `export KUBECONFIG=... TFDATA_TEST_KUBECONFIG=...`
#   kind/cluster.sh logs D `kind export logs` into directory D (node journal, pod logs)
#   kind/cluster.sh load IMAGE...  `kind load docker-image` into the cluster's node (an image of a
#                          user's a test builds; skipped when the node has it with the same ID)
#
# up:
#   1. the node image (kind/node-image.sh: the published one where it can be
#      pulled, else one built here from source);
#   2. `kind create cluster` (kind $KIND_VERSION) with kind/docker-shim first on
#      PATH: on hosts where `docker run --privileged` cannot work (a capability missing
#      from the bounding set) the shim passes the explicit equivalent; elsewhere it
#      changes nothing;
#   3. on a node image built here, kube-network-policies (network-policies.yaml);
#   4. `kind load docker-image` tfdata-operator:<version> and tfdata-server:<version>
#      (images/images.sh builds them when missing);
#   5. metrics-server, built here from source (kind/metrics-server.sh), for the
#      HorizontalPodAutoscaler of `spec.autoscaling.metric: CPU`;
#   6. `helm upgrade --install` of charts/tfdata-operator (the CRD from its crds/) into
#      namespace tfdata-system with image.pullPolicy=Never, and waits for the operator.
# The kubeconfig is written to .local/kind-kubeconfig (.local/kind-<name>-kubeconfig for a
# cluster named otherwise).
#
# Settings (environment): TFDATA_KIND_CLUSTER (default tfdata), TFDATA_CACHE.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

CLUSTER="${TFDATA_KIND_CLUSTER:-tfdata}"
# The default cluster's kubeconfig is .local/kind-kubeconfig; another's is named after it.
if [[ "$CLUSTER" == tfdata ]]; then KUBECONFIG_OUT="$REPO/.local/kind-kubeconfig"; else KUBECONFIG_OUT="$REPO/.local/kind-$CLUSTER-kubeconfig"; fi
NAMESPACE=tfdata-system
RELEASE=tfdata-operator
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

cluster_exists() { [[ -x "$KIND" ]] && kind_ get clusters 2>/dev/null | grep -qxF "$CLUSTER"; }

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
    log "cluster $CLUSTER exists; reusing it"
    kind_ get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_OUT"
  else
    config="$REPO/.local/kind-$CLUSTER-config.yaml"
    write_config "$image" >"$config"
    log "creating cluster $CLUSTER from $image"
    kind_ create cluster --name "$CLUSTER" --image "$image" --config "$config" \
      --kubeconfig "$KUBECONFIG_OUT" --wait 5m >&2
  fi
  export KUBECONFIG="$KUBECONFIG_OUT"
  if [[ "$image" == "$KIND_NODE_IMAGE_LOCAL" ]]; then
    # No kindnetd in this image: its NetworkPolicy engine runs on its own.
    grep -qF "image: $KNP_IMAGE" "$HERE/network-policies.yaml" || die "network-policies.yaml does not run $KNP_IMAGE"
    kubectl apply -f "$HERE/network-policies.yaml" >&2
    kubectl -n kube-system rollout status daemonset/kube-network-policies --timeout=3m >&2
    # It has no readiness probe: enforcing means its nftables table exists in the node.
    local i
    for i in $(seq 1 120); do
      "$DOCKER" exec "$CLUSTER-control-plane" nft list table inet kube-network-policies >/dev/null 2>&1 && break
      ((i < 120)) || die "kube-network-policies wrote no nftables rules in 120 s: $(kubectl -n kube-system logs daemonset/kube-network-policies --tail=20 2>&1)"
      sleep 1
    done
  fi

  local img
  for img in "tfdata-operator:$VERSION" "tfdata-server:$VERSION"; do
    "$DOCKER" image inspect "$img" >/dev/null 2>&1 || "$REPO/images/images.sh" >&2
  done
  local t
  t="$(date +%s)"
  # kind skips an image the node already has with the same ID.
  kind_ load docker-image --name "$CLUSTER" "tfdata-operator:$VERSION" "tfdata-server:$VERSION" >&2
  log "loaded tfdata-operator:$VERSION and tfdata-server:$VERSION in $(elapsed "$t")"

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
    --wait --timeout 5m >&2
  kubectl -n "$NAMESPACE" rollout status deployment --timeout=3m >&2
  # The default StorageClass's provisioner (dispatcher journals need it).
  kubectl -n local-path-storage rollout status deployment/local-path-provisioner --timeout=3m >&2
  wait_condition crd/tfdataservices.tfdata.dev Established 60
  log "cluster $CLUSTER is up with the operator ($(elapsed "$started")); KUBECONFIG=$KUBECONFIG_OUT"
}

# One control-plane node. With a node image built here (no kindnetd: see
# kind/README.md) kind's default CNI is off and the node gets a static ptp
# configuration instead, with kube-network-policies (network-policies.yaml, applied by
# `up`) enforcing NetworkPolicies; with the published image kind's own kindnetd runs.
write_config() {
  cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  # The built-here node keeps these inside itself (base/entrypoint).
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/16
EOF
  if [[ "$1" == "$KIND_NODE_IMAGE_LOCAL" ]]; then
    cat <<EOF
  disableDefaultCNI: true
nodes:
- role: control-plane
  extraMounts:
  - hostPath: $HERE/cni/10-tfdata-ptp.conflist
    containerPath: /etc/cni/net.d/10-tfdata-ptp.conflist
    readOnly: true
EOF
  else
    cat <<EOF
nodes:
- role: control-plane
EOF
  fi
}

load() {  # image...
  local started
  started="$(date +%s)"
  eval "$("$REPO/images/docker-daemon.sh" env)"
  cluster_exists || die "no cluster $CLUSTER: run kind/cluster.sh up first"
  kind_ load docker-image --name "$CLUSTER" "$@" >&2
  log "loaded $* into $CLUSTER in $(elapsed "$started")"
}

down() {
  if cluster_exists; then
    log "deleting cluster $CLUSTER"
    kind_ delete cluster --name "$CLUSTER" >&2
  else
    log "no cluster $CLUSTER"
  fi
  rm -f "$KUBECONFIG_OUT"
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
  env) printf 'export KUBECONFIG=%q TFDATA_TEST_KUBECONFIG=%q\n' "$KUBECONFIG_OUT" "$KUBECONFIG_OUT" ;;
  *)
    echo "usage: $0 [up|down|env|logs DIR|load IMAGE...]" >&2
    exit 2
    ;;
esac
