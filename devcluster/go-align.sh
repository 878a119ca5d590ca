# shellcheck shell=bash
# Sourced by the scripts that build Go programs from the module proxy (devcluster/k8s-binaries.sh,
# kind/build-binaries.sh): align_to_kubernetes and kubernetes_modules.
#
# Go's build cache keys a compiled package by its module's path and selected version, its source
# and its dependencies' keys. Each of those programs selects its own versions of the libraries
# Kubernetes is made of (client-go, apimachinery, grpc, protobuf, prometheus, golang.org/x/...),
# mostly older ones, so on a fresh machine the same libraries were compiled once per program.
# Aligned, a program selects the Kubernetes build's version
# of each library both use, its packages have the same keys, and Go compiles them once (the
# program is built after Kubernetes: see `make test`'s kind lane).
#
# Every module both select is required at the Kubernetes build's version (upgrades, for programs
# older than Kubernetes v1.34.4; some patch or pre-release downgrades). Go's
# minimal version selection still picks a newer one where another dependency needs it, and then
# that module and what imports it are compiled again. Only programs that build and pass the kind
# tier aligned are built this way (kind/README.md lists which, and why not the others); with
# pinned versions, a program that compiles aligned today compiles the same way tomorrow.

# align_to_kubernetes K8S_MODULES_FILE: in the main module of the current directory (a writable
# copy), requires every module that K8S_MODULES_FILE (`go list -m all` of the Kubernetes build) also
# lists, at that version. Prints how many it moved.
align_to_kubernetes() {
  local modules="$1" args=() m ours theirs
  [[ -s "$modules" ]] || { echo "align_to_kubernetes: no module list at $modules" >&2; return 1; }
  while read -r m ours theirs; do
    args+=("-require=$m@$theirs")
  done < <(go list -m all | tail -n +2 | awk 'NR == FNR { k[$1] = $2; next } ($1 in k) && k[$1] != $2 { print $1, $2, k[$1] }' "$modules" -)
  ((${#args[@]} == 0)) || go mod edit "${args[@]}"
  echo "${#args[@]}"
}

# kubernetes_modules K8S_BUILD_DIR OUT: writes `go list -m all` of the Kubernetes build module in
# K8S_BUILD_DIR (devcluster/k8s-binaries.sh's) to OUT, once per go.mod.
kubernetes_modules() {
  local dir="$1" out="$2"
  [[ -f "$dir/go.mod" ]] || { echo "kubernetes_modules: no Kubernetes build module in $dir (build Kubernetes first)" >&2; return 1; }
  if [[ ! -s "$out" || "$dir/go.mod" -nt "$out" ]]; then
    (cd "$dir" && go list -m all) >"$out.tmp" && mv "$out.tmp" "$out"
  fi
}
