#!/usr/bin/env bash
# Kueue (kubernetes-sigs/kueue) on the kind cluster, built here from its Go module: the job
# queueing controller a shared cluster's operator installs, and what a TFDataService must live
# with there (issue 39: its StatefulSet and pod integrations are on by default).
#
#   kind/kueue.sh image       build $KUEUE_IMAGE (idempotent); prints its name last
#   kind/kueue.sh manifests   print the manifests to apply: Kueue's config/default kustomization
#                             (its internal certificate management, no cert-manager), the image
#                             pinned with pullPolicy Never, and the manager's Configuration from
#                             $KUEUE_CONFIG when set (else Kueue's own default)
#   kind/kueue.sh install     image, `kind load` into $TFDATA_KIND_CLUSTER, apply the manifests
#                             server-side, wait until its webhooks answer; idempotent
#   kind/kueue.sh uninstall   delete what install applied
#
# Settings (environment): TFDATA_KIND_CLUSTER (as kind/cluster.sh), KUEUE_CONFIG (a file holding
# a config.kueue.x-k8s.io/v1beta2 Configuration, for example with manageJobsWithoutQueueName or
# integrations.externalFrameworks; `install` restarts the manager when it changed), KUEUE_WAIT
# (seconds, default 300).
#
# Kept out of versions.sh, as metrics-server.sh is: an ordinary Deployment, loaded like our own
# images, not part of the node image. The module's hash is pinned below and checked; the
# checksum database the proxy relays knows this version too. Upstream's image is
# distroless/static with /manager; scratch holds the same static binary (the manager runs with a
# read-only root filesystem; its certificates come from a Secret volume Kueue itself writes).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

# v0.19.2 (2026-08-20): the newest release the module proxy serves (v0.18.0, v0.17.2 and
# v0.16.0 are refused with 403). Built with Kubernetes v0.36 client libraries; Kueue supports
# the API server's last minors, v1.34 included.
KUEUE_VERSION="v0.19.2"
KUEUE_MODULE="sigs.k8s.io/kueue"
KUEUE_MODULE_SUM="h1:mPNzr37u0nwI7ikST5QQl5gg6EgtYOAvC9ZbTgywdN8="
KUEUE_IMAGE="registry.k8s.io/kueue/kueue:$KUEUE_VERSION"
KUEUE_NAMESPACE=kueue-system
OUT="$KIND_CACHE/kueue-$KUEUE_VERSION"
LABEL="dev.tfdata.kind.kueue-sum"
CLUSTER="${TFDATA_KIND_CLUSTER:-tfdata}"
WAIT="${KUEUE_WAIT:-300}"

log() { printf '[kueue %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
export GOFLAGS="-trimpath -buildvcs=false -modcacherw -gcflags=all=-dwarf=false"
export GOMODCACHE="$GO_CACHE_DIR/mod" GOCACHE="$GO_CACHE_DIR/build"

# The module's source directory, after checking its hash against the pin.
module_dir() {
  local json sum
  json="$(go mod download -json "$KUEUE_MODULE@$KUEUE_VERSION")" || die "go mod download $KUEUE_MODULE@$KUEUE_VERSION failed: $json"
  sum="$(sed -nE 's/^\s*"Sum": "(.*)",?$/\1/p' <<<"$json")"
  [[ "$sum" == "$KUEUE_MODULE_SUM" ]] || die "$KUEUE_MODULE@$KUEUE_VERSION has hash '$sum', pinned: $KUEUE_MODULE_SUM"
  sed -nE 's/^\s*"Dir": "(.*)",?$/\1/p' <<<"$json"
}

# `make test` builds the image in the background, beside the node image and the cluster
# (the Makefile's kind-image-after-binaries); the kind tier's install waits here for that build rather than
# starting a second one.
image() {
  mkdir -p "$OUT"
  exec 6>"$OUT/.lock"
  flock -n 6 || { log "another build of $KUEUE_IMAGE is running; waiting for it"; flock 6; }
  build_image
  exec 6>&-
}

build_image() {
  eval "$("$REPO/images/docker-daemon.sh" up)"
  if [[ "$("$DOCKER" image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$KUEUE_IMAGE" 2>/dev/null)" == "$KUEUE_MODULE_SUM" ]]; then
    echo "$KUEUE_IMAGE"
    return
  fi
  local dir started
  dir="$(module_dir)"
  if [[ ! -x "$OUT/manager" ]]; then
    started="$(date +%s)"
    log "building $KUEUE_MODULE $KUEUE_VERSION (cold Go cache: 9 min of CPU, 44 min on 2 cores shared with other builds; warm: a link, under a minute)"
    # Its own main module, read-only, with the version stamped as its Makefile's `build` does.
    (cd "$dir" && go build -mod=readonly \
      -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.GitCommit=$KUEUE_VERSION" \
      -o "$OUT/manager.tmp" ./cmd/kueue)
    mv "$OUT/manager.tmp" "$OUT/manager"
    log "built in $(($(date +%s) - started))s"
  fi
  cat >"$OUT/Dockerfile" <<'EOF'
FROM scratch
COPY manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
EOF
  "$DOCKER" build -q --label "$LABEL=$KUEUE_MODULE_SUM" --label "dev.tfdata.kind.built-from=source" \
    --tag "$KUEUE_IMAGE" "$OUT" >/dev/null
  log "built $KUEUE_IMAGE"
  echo "$KUEUE_IMAGE"
}

manifests() {
  local dir work config_hash
  dir="$(module_dir)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  cp -a "$dir/config" "$work/"
  chmod -R u+w "$work"
  if [[ -n "${KUEUE_CONFIG:-}" ]]; then
    [[ -f "$KUEUE_CONFIG" ]] || die "KUEUE_CONFIG=$KUEUE_CONFIG is not a file"
    grep -q '^kind: Configuration' "$KUEUE_CONFIG" || die "KUEUE_CONFIG=$KUEUE_CONFIG holds no 'kind: Configuration' (config.kueue.x-k8s.io/v1beta2)"
    cp "$KUEUE_CONFIG" "$work/config/components/manager/controller_manager_config.yaml"
  fi
  # The Configuration reaches the manager only when it starts: its hash in the pod template
  # restarts the manager when it changes, and only then.
  config_hash="$(sha256sum "$work/config/components/manager/controller_manager_config.yaml" | cut -c1-16)"
  cat >"$work/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- config/default
images:
- name: us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue
  newName: ${KUEUE_IMAGE%:*}
  newTag: $KUEUE_VERSION
patches:
- target: {group: apps, version: v1, kind: Deployment, name: kueue-controller-manager}
  patch: |
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: Never
    - op: add
      path: /spec/template/metadata/annotations/tfdata.dev~1kueue-config
      value: "$config_hash"
EOF
  kubectl kustomize "$work"
}

install() {
  local k8sbin deadline started
  started="$(date +%s)"
  k8sbin="$("$REPO/devcluster/k8s-binaries.sh" | tail -n 1)"   # kubectl
  export PATH="$k8sbin:$PATH"
  eval "$(TFDATA_KIND_CLUSTER="$CLUSTER" "$HERE/cluster.sh" env)"
  [[ -f "$KUBECONFIG" ]] || die "no kubeconfig $KUBECONFIG: run TFDATA_KIND_CLUSTER=$CLUSTER kind/cluster.sh up first"
  image >/dev/null
  TFDATA_KIND_CLUSTER="$CLUSTER" "$HERE/cluster.sh" load "$KUEUE_IMAGE"
  # Server-side: Kueue's CRDs are too large for client-side apply's annotation.
  manifests | kubectl apply --server-side --force-conflicts -f - >/dev/null
  kubectl -n "$KUEUE_NAMESPACE" rollout status deployment/kueue-controller-manager --timeout="${WAIT}s" >&2 ||
    die "Kueue's manager was not ready in ${WAIT}s: $(kubectl -n "$KUEUE_NAMESPACE" get pods -o wide 2>&1; kubectl -n "$KUEUE_NAMESPACE" logs deployment/kueue-controller-manager --tail=30 2>&1)"
  # Ready is not serving: the webhooks answer once Kueue has written its certificate into the
  # Secret, the kubelet has synced it into the pod and the CA bundles are injected. A dry-run
  # create of a ResourceFlavor goes through its webhook.
  deadline=$((SECONDS + WAIT))
  local out
  until out="$(printf 'apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: tfdata-kueue-probe}\n' |
    kubectl create --dry-run=server -f - 2>&1)"; do
    ((SECONDS < deadline)) || die "Kueue's webhooks did not answer in ${WAIT}s; last answer: $out; pods: $(kubectl -n "$KUEUE_NAMESPACE" get pods -o wide 2>&1)"
    sleep 2
  done
  log "Kueue $KUEUE_VERSION is serving in $CLUSTER ($(($(date +%s) - started))s; KUBECONFIG=$KUBECONFIG)"
}

uninstall() {
  local k8sbin
  k8sbin="$("$REPO/devcluster/k8s-binaries.sh" | tail -n 1)"
  export PATH="$k8sbin:$PATH"
  eval "$(TFDATA_KIND_CLUSTER="$CLUSTER" "$HERE/cluster.sh" env)"
  manifests | kubectl delete --ignore-not-found --wait=true -f - >&2
}

case "${1:-image}" in
  image) image ;;
  manifests) manifests ;;
  install) install ;;
  uninstall) uninstall ;;
  *)
    echo "usage: $0 [image|manifests|install|uninstall]" >&2
    exit 2
    ;;
esac
