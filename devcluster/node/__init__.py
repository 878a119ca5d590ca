"""A node for the dev cluster (devcluster.controlplane) that runs each Pod's containers as local processes.

Test and development infrastructure, not the product: enough of a kubelet for the
operator's pods (and simple test pods) to really run, on a machine without a
container runtime or registry.

    python -m devcluster.node run     --state-dir DIR    # what devcluster's NODE_AGENT component runs
    python -m devcluster.node client  --state-dir DIR [--namespace NS] -- python script.py
    python -m devcluster.node cleanup --state-dir DIR    # what `devcluster down` calls

What it does, for one Node (`tfdata-dev-node`), with the admin kubeconfig of DIR:

- registers the Node (cpu 16, memory 64Gi, pods 110), keeps it Ready (status heartbeat
  and its Lease in kube-node-lease), and creates the default StorageClass `standard`;
- provisions claims of that class as directories under DIR/node/volumes (a PV pre-bound
  to the claim; deleted with its directory once Released), so a dispatcher's journal
  outlives its pod;
- runs each container of each Pod bound to it: `command` + `args` with the Pod's env
  (values, fieldRefs, `$(VAR)` expansion), in a network namespace of its own with an IP
  on a bridge (stable per pod name: a StatefulSet pod keeps its IP when recreated), with
  emptyDir/configMap/secret/hostPath/persistentVolumeClaim volumes bind-mounted in a
  private mount namespace; probes, restarts, status, graceful deletion as a kubelet does;
- writes /etc/hosts for every pod and client namespace (`ip netns exec` binds
  /etc/netns/<netns>/hosts over /etc/hosts), in which Services and the pod hostnames of
  headless Services resolve.

What it does NOT do (so what a test on it cannot show):

- No images: a container runs the project's Python environment (the venv's bin dir
  first on PATH, so `tfdata-server` and `python` resolve); `image` is ignored and never
  pulled, and a container without `command` cannot run.
- No isolation beyond network, mounts and CPU: containers run as root with the host's
  filesystem; runAsUser, runAsNonRoot, readOnlyRootFilesystem, capabilities, seccomp
  and memory limits are not enforced. CPU is, as a kubelet does on cgroup v1, where the
  host mounts the `cpu` controller writable (/sys/fs/cgroup/cpu): a container with a CPU
  limit or request runs in a cgroup of its own, `tfd<id>/pod<uid>/<container>`, with
  cpu.cfs_quota_us from `limits.cpu` and cpu.shares from `requests.cpu`. Without that
  controller the agent says so in its log and enforces nothing. A volume's mount point that does not exist on
  the host is created there (an empty directory, e.g. /var/lib/tfdata).
- No kube-proxy and no DNS server: Service names resolve through the hosts files to a
  pod IP (for a non-headless Service, one pod its selector matches, ready ones first, and
  while it has none the address it last named, as a ClusterIP outlives its pods; a
  StatefulSet pod comes back at its old address), so a Service's `port` must equal its
  `targetPort`. Short names (`<svc>`) resolve in
  the pod's own namespace only. Pods cannot reach the API server (no route, no token).
- No kubelet API: `kubectl logs/exec/port-forward` do not work. Container output goes
  to DIR/logs/pods/<namespace>_<pod>/<container>.log (kept by `down`, like the
  components' logs).
- Not supported (logged and skipped): init and ephemeral containers, env from
  configMapKeyRef/secretKeyRef/resourceFieldRef, projected/downwardAPI and other volume
  types, grpc probes, lifecycle hooks. ConfigMap/Secret volumes and `envFrom` are read
  once, at pod start; a pod whose ConfigMap or Secret is missing (and not `optional`)
  stays Pending, saying which, until it exists.

Names are derived from DIR, so several clusters (a dev cluster and test sessions) run
side by side: netns `tfd<id>` (the bridge), `tfd<id>-<n>` (pods and clients, <n> the
last octet of their IP), host link `tfd<id>` (the node's InternalIP, <subnet>.1), with
<id> 12 hex digits of a hash of DIR and a /24 under 10.128.0.0/9 that overlaps no route
of the host. The bridge lives in its own network namespace, so pod-to-pod traffic never
crosses the host's firewall (Docker's FORWARD policy is DROP).

Its modules, one duty each: `network` (names and addresses of a cluster's node: state
dirs, network namespaces, the bridge's IPs; `cleanup`, `leftovers`), `cpu` (cgroups),
`hosts` (the hosts files), `api` (the API client), `containers` (a container's process
and probes), `pods` (a PodRunner per pod), `agent` (the Node and the loop), `clients`
(`client_netns`, `client_env`) and `cli` (the command line above).
"""

from __future__ import annotations

from .agent import NODE_NAME, STORAGE_CLASS, Agent
from .clients import client_env, client_netns
from .cpu import CpuLimits, cfs_settings, millicores
from .hosts import hosts_entries, hosts_text
from .network import Layout, Network, cleanup, leftovers

__all__ = [
    "NODE_NAME",
    "STORAGE_CLASS",
    "Agent",
    "CpuLimits",
    "Layout",
    "Network",
    "cfs_settings",
    "cleanup",
    "client_env",
    "client_netns",
    "hosts_entries",
    "hosts_text",
    "leftovers",
    "millicores",
]
