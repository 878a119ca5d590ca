#!/usr/bin/env python3
"""A node for the dev cluster (hack/devcluster.py) that runs each Pod's containers as local processes.

Test and development infrastructure, not the product: enough of a kubelet for the
operator's pods (and simple test pods) to really run, on a machine without a
container runtime or registry.

    python hack/nodeagent.py run    --state-dir DIR    # what devcluster's NODE_AGENT component runs
    python hack/nodeagent.py client --state-dir DIR [--namespace NS] -- python script.py
    python hack/nodeagent.py cleanup --state-dir DIR   # what `devcluster down` calls

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
  pod IP (for a non-headless Service, one pod its selector matches, ready ones first),
  so a Service's `port` must equal its `targetPort`. Short names (`<svc>`) resolve in
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
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import decimal
import fcntl
import hashlib
import http.client
import ipaddress
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NODE_NAME = "tfdata-dev-node"
STORAGE_CLASS = "standard"
PROVISIONER = "tfdata.dev/dev-node"
CLUSTER_DOMAIN = "cluster.local"
IP = shutil.which("ip") or "/usr/sbin/ip"
TICK_SECONDS = 0.25
HEARTBEAT_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 10.0  # a kubelet backs off up to 5 minutes; tests cannot wait that long
SHUTDOWN_GRACE_SECONDS = 3.0  # devcluster's `down` SIGKILLs the agent after 10 s
# cgroup v1's cpu controller, where the host mounts it; a kubelet's CFS period, and the kernel's
# smallest quota (a kubelet's floor too).
CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1_000
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
HOSTS_HEADER = "# Written by the tfdata dev node (hack/nodeagent.py); rewritten as pods and services change.\n"

log = logging.getLogger("nodeagent")
Obj = dict[str, Any]


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- Names and addresses of one cluster's node ------------------------------------------


class Layout:
    """Where a cluster's node keeps its state, and the names of its kernel objects."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).resolve()
        # 12 hex digits: unique enough across state dirs, and `tfd` + id fits a link name (15).
        self.id = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
        self.prefix = f"tfd{self.id}"
        self.bridge_ns = self.prefix
        self.host_link = self.prefix
        self.node_dir = self.state_dir / "node"
        self.pods_dir = self.node_dir / "pods"
        self.volumes_dir = self.node_dir / "volumes"
        self.clients_dir = self.node_dir / "clients"
        self.logs_dir = self.state_dir / "logs" / "pods"
        self.cpu_cgroup = CPU_CGROUP_ROOT / self.prefix

    def netns(self, ip: str) -> str:
        return f"{self.prefix}-{ip.rsplit('.', 1)[1]}"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _netns_list() -> list[str]:
    return [line.split()[0] for line in _run(IP, "netns", "list").stdout.splitlines() if line.strip()]


def _kill_netns(name: str) -> None:
    """Kills every process in a network namespace (containers and anything they spawned) and deletes it."""
    for _ in range(50):
        pids = [int(p) for p in _run(IP, "netns", "pids", name, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    _run(IP, "netns", "delete", name, check=False)
    shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


class Network:
    """The bridge, the /24 and the IPs of one cluster; shared by the agent and `client`."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.config_path = layout.node_dir / "network.json"
        self.ips_path = layout.node_dir / "ips.json"
        self.subnet: ipaddress.IPv4Network | None = None
        if self.config_path.exists():
            self.subnet = ipaddress.IPv4Network(json.loads(self.config_path.read_text())["subnet"])

    @property
    def gateway(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def _choose_subnet(self) -> ipaddress.IPv4Network:
        used = []
        for route in json.loads(_run(IP, "-j", "-4", "route", "show", "table", "all").stdout or "[]"):
            dst = route.get("dst", "default")
            if dst != "default":
                used.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
        for attempt in range(1000):
            digest = hashlib.sha256(f"{self.layout.state_dir}:{attempt}".encode()).digest()
            candidate = ipaddress.IPv4Network(f"10.{128 + digest[0] % 128}.{digest[1]}.0/24")
            if not any(candidate.overlaps(u) for u in used):
                return candidate
        raise RuntimeError("no free /24 under 10.128.0.0/9 for the node's pods")

    def setup(self) -> None:
        """The bridge namespace and the host's link into it, from scratch."""
        self.layout.node_dir.mkdir(parents=True, exist_ok=True)
        if self.subnet is None:
            self.subnet = self._choose_subnet()
            self.config_path.write_text(json.dumps({"subnet": str(self.subnet)}) + "\n")
        ns, link = self.layout.bridge_ns, self.layout.host_link
        _run(IP, "netns", "add", ns)
        _run(IP, "-n", ns, "link", "set", "lo", "up")
        _run(IP, "-n", ns, "link", "add", "br0", "type", "bridge")
        _run(IP, "-n", ns, "link", "set", "br0", "up")
        _run(IP, "link", "add", link, "type", "veth", "peer", "name", "host", "netns", ns)
        _run(IP, "-n", ns, "link", "set", "host", "master", "br0", "up")
        _run(IP, "addr", "add", f"{self.gateway}/24", "dev", link)
        _run(IP, "link", "set", link, "up")

    @contextlib.contextmanager
    def _ips(self) -> Iterator[dict[str, Any]]:
        """The IP table {key: [ip, last used]}, locked: the agent and clients allocate concurrently."""
        with open(self.layout.node_dir / "ips.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            table: dict[str, Any] = json.loads(self.ips_path.read_text()) if self.ips_path.exists() else {}
            yield table
            self.ips_path.write_text(json.dumps(table, indent=1) + "\n")

    def allocate(self, key: str, in_use: Collection[str] = ()) -> str:
        """The IP of `key` (a pod's namespace/name): the same one as last time, so a recreated
        StatefulSet pod keeps its address, as clients of a Service would expect."""
        assert self.subnet is not None
        with self._ips() as table:
            if key not in table:
                taken = {entry[0] for entry in table.values()}
                free = [str(a) for a in list(self.subnet.hosts())[1:] if str(a) not in taken]
                if not free:  # reuse the address of the name unused longest
                    idle = sorted((v[1], k) for k, v in table.items() if k not in in_use)
                    if not idle:
                        raise RuntimeError(f"no free IP in {self.subnet}")
                    free = [table.pop(idle[0][1])[0]]
                table[key] = [free[0], 0]
            table[key][1] = time.time()
            return str(table[key][0])

    def release(self, key: str) -> None:
        if not self.layout.node_dir.exists():
            return  # the cluster is gone (`down`), and its table with it
        with self._ips() as table:
            table.pop(key, None)

    def add(self, netns: str, ip: str) -> None:
        """A network namespace with `ip` on the bridge (eth0) and loopback up."""
        _kill_netns(netns)  # a leftover of the same name (an agent killed mid-teardown)
        _run(IP, "netns", "add", netns)
        peer = f"p{ip.rsplit('.', 1)[1]}"
        _run(
            IP, "-n", self.layout.bridge_ns, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", netns
        )
        _run(IP, "-n", self.layout.bridge_ns, "link", "set", peer, "master", "br0", "up")
        # The MAC follows from the IP: a pod recreated with its IP keeps its MAC too, so the
        # neighbour caches of the host and of other pods stay right (a new random MAC left
        # the old one cached for ~45 s, during which the new pod was unreachable).
        mac = "02:00:" + ":".join(f"{int(octet):02x}" for octet in ip.split("."))
        _run(IP, "-n", netns, "link", "set", "eth0", "address", mac)
        _run(IP, "-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _run(IP, "-n", netns, "link", "set", "eth0", "up")
        _run(IP, "-n", netns, "link", "set", "lo", "up")
        # No default route: pods and clients reach the bridge's /24 and nothing else.


def cleanup(state_dir: Path) -> None:
    """Removes everything of a cluster's node outside its state dir: processes in its
    network namespaces, the namespaces (their veths go with them), the host link and the
    hosts files. Safe to call when nothing is left; `devcluster down` calls it."""
    layout = Layout(state_dir)
    for name in _netns_list():
        if name == layout.bridge_ns or name.startswith(f"{layout.prefix}-"):
            _kill_netns(name)
    _run(IP, "link", "delete", layout.host_link, check=False)
    shutil.rmtree(layout.clients_dir, ignore_errors=True)
    remove_cgroups(layout.cpu_cgroup)


def leftovers(state_dir: Path, *patterns: str) -> dict[str, list[str]]:
    """What of a cluster's node is still there: network namespaces, links, hosts files,
    mounts, and processes whose command line mentions the state dir or one of `patterns`."""
    layout = Layout(state_dir)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout.splitlines()
    etc = [p.name for p in Path("/etc/netns").glob(f"{layout.prefix}*")] if Path("/etc/netns").is_dir() else []
    processes = []
    for pattern in (str(layout.state_dir), *patterns):
        found = subprocess.run(["pgrep", "-af", "--", pattern], capture_output=True, text=True).stdout.splitlines()
        processes += [line for line in found if str(os.getpid()) != line.split()[0] and "pgrep" not in line]
    return {
        "netns": [n for n in netns if n.startswith(layout.prefix)],
        "links": [link for link in links if layout.prefix in link],
        "hosts files": etc,
        "mounts": [m for m in mounts if layout.prefix in m or str(layout.state_dir) in m],
        "processes": processes,
        "cgroups": [str(layout.cpu_cgroup)] if layout.cpu_cgroup.is_dir() else [],
    }


# --- CPU limits ------------------------------------------------------------------------------


def millicores(quantity: str | int | float | None) -> int | None:
    """A CPU quantity ("500m", "2", "0.25") in millicores, rounded up as Kubernetes does; None if unset."""
    if quantity is None:
        return None
    text = str(quantity)
    try:
        value = decimal.Decimal(text[:-1]) / 1000 if text.endswith("m") else decimal.Decimal(text)
    except decimal.InvalidOperation:
        log.warning("CPU quantity %r not understood; not enforced", text)
        return None
    return int((value * 1000).to_integral_value(rounding=decimal.ROUND_CEILING))


def cfs_settings(resources: Obj) -> dict[str, int]:
    """The cgroup v1 cpu files a kubelet writes for a container's resources (none without CPU)."""
    limit = millicores(resources.get("limits", {}).get("cpu"))
    # A limit without a request: the API server defaults the request to the limit.
    request = millicores(resources.get("requests", {}).get("cpu")) or limit
    settings = {}
    if limit:
        settings["cpu.cfs_period_us"] = CFS_PERIOD_US
        settings["cpu.cfs_quota_us"] = max(MIN_CFS_QUOTA_US, limit * CFS_PERIOD_US // 1000)
    if request:
        settings["cpu.shares"] = max(2, request * 1024 // 1000)
    return settings


def remove_cgroups(directory: Path) -> None:
    """Removes a cgroup directory and the ones under it, deepest first (a cgroup with
    processes in it stays: they are killed before this runs)."""
    if not directory.is_dir():
        return
    for parent, _, _ in sorted(os.walk(directory), key=lambda walked: -len(Path(walked[0]).parts)):
        with contextlib.suppress(OSError):
            os.rmdir(parent)


class CpuLimits:
    """One cgroup per container with CPU resources, under the node's own cgroup."""

    def __init__(self, layout: Layout) -> None:
        self.root = layout.cpu_cgroup
        self.enforced = False

    def setup(self) -> None:
        try:
            self.root.mkdir(exist_ok=True)
            (self.root / "cpu.cfs_quota_us").read_text()
        except OSError as e:
            log.warning("CPU limits are not enforced: no writable cgroup v1 cpu controller at %s (%s)", self.root, e)
            return
        self.enforced = True
        log.info("CPU limits and requests are enforced through %s", self.root)

    def container(self, pod_uid: str, name: str, resources: Obj) -> Path | None:
        """The container's cgroup, set up; None when it has no CPU resources or nothing is enforced."""
        settings = cfs_settings(resources)
        if not self.enforced or not settings:
            return None
        directory = self.root / f"pod{pod_uid}" / name
        directory.mkdir(parents=True, exist_ok=True)
        for file, value in settings.items():
            (directory / file).write_text(str(value))
        return directory

    @staticmethod
    def enter(cgroup: Path, pid: int) -> None:
        """Moves a started process into its cgroup (again: writing a member's pid is a no-op)."""
        try:
            (cgroup / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass  # it has exited already; its exit is seen on the next tick
        except OSError as e:
            log.warning("could not move pid %d into %s: %s", pid, cgroup, e)

    def remove(self, pod_uid: str) -> None:
        remove_cgroups(self.root / f"pod{pod_uid}")


# --- Hosts files ---------------------------------------------------------------------------


def _matches(selector: dict[str, str] | None, labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())


def _is_ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def hosts_entries(pods: list[Obj], services: list[Obj]) -> tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    """(name -> IPs valid in every namespace, namespace -> name -> IPs of short names)."""
    everywhere: dict[str, list[str]] = {}
    local: dict[str, dict[str, list[str]]] = {}
    live = [p for p in pods if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")]

    def add(ns: str | None, name: str, ips: list[str]) -> None:
        target = everywhere if ns is None else local.setdefault(ns, {})
        target.setdefault(name, []).extend(ip for ip in ips if ip not in target.get(name, []))

    for svc in services:
        ns, name, spec = svc["metadata"]["namespace"], svc["metadata"]["name"], svc.get("spec", {})
        headless = spec.get("clusterIP") == "None"
        members = sorted(
            (
                p
                for p in live
                if p["metadata"]["namespace"] == ns and _matches(spec.get("selector"), p["metadata"].get("labels", {}))
            ),
            key=lambda p: (not _is_ready(p), p["metadata"]["name"]),
        )
        eligible = [p for p in members if _is_ready(p) or (headless and spec.get("publishNotReadyAddresses"))]
        if not headless:
            # No kube-proxy: the Service's name stands for one of its pods, ready ones first.
            eligible = eligible[:1] or members[:1]
        ips = [p["status"]["podIP"] for p in eligible]
        if not ips:
            continue
        for fq in (f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.{CLUSTER_DOMAIN}"):
            add(None, fq, ips)
        add(ns, name, ips)
        if headless:  # `<hostname>.<subdomain>.<ns>.svc.<domain>`, as StatefulSet pods have
            for pod in eligible:
                pspec = pod.get("spec", {})
                if pspec.get("subdomain") == name and pspec.get("hostname"):
                    host, ip = pspec["hostname"], [pod["status"]["podIP"]]
                    for fq in (
                        f"{host}.{name}.{ns}",
                        f"{host}.{name}.{ns}.svc",
                        f"{host}.{name}.{ns}.svc.{CLUSTER_DOMAIN}",
                    ):
                        add(None, fq, ip)
                    add(ns, f"{host}.{name}", ip)
    return everywhere, local


def hosts_text(entries: tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]], namespace: str | None) -> str:
    everywhere, local = entries
    names = {**everywhere, **local.get(namespace or "", {})}
    lines = [HOSTS_HEADER, "127.0.0.1\tlocalhost\n", "::1\tlocalhost ip6-localhost ip6-loopback\n"]
    lines += [f"{ip}\t{name}\n" for name, ips in sorted(names.items()) for ip in ips]
    return "".join(lines)


def write_hosts(netns: str, text: str) -> None:
    """Rewrites /etc/netns/<netns>/hosts in place: `ip netns exec` bind-mounted that very
    inode over the running containers' /etc/hosts, so a new file (rename) would go unseen."""
    path = Path(f"/etc/netns/{netns}/hosts")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    with open(path, "r+") as f:  # not "a+": appending mode would ignore the seek
        if f.read() == text:
            return
        f.seek(0)
        f.write(text)  # then truncate: a reader never sees an empty file
        f.truncate()


# --- The API ---------------------------------------------------------------------------------


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class Api:
    """Raw JSON over the official client's connection handling (auth, TLS from the kubeconfig)."""

    def __init__(self, kubeconfig: Path) -> None:
        import kubernetes  # here, not at the top: `cleanup` and `client` must not need it

        self.client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))

    def call(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json", timeout: float = 30, stream: bool = False,
    ) -> Any:  # fmt: skip
        method, url, headers, payload, _ = self.client.param_serialize(
            method, path, query_params=query or [], body=body, auth_settings=["BearerToken"],
            header_params={"Accept": "application/json", "Content-Type": content_type},
        )  # fmt: skip
        response = self.client.call_api(method, url, header_params=headers, body=payload, _request_timeout=timeout)
        if stream and response.status == 200:
            return response.response  # urllib3's response: iterate it for watch events
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiError(response.status, data.decode(errors="replace"))
        return json.loads(data) if data else {}

    def get(self, path: str) -> Obj | None:
        try:
            result: Obj = self.call("GET", path)
            return result
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def create(self, path: str, body: Obj) -> None:
        try:
            self.call("POST", path, body)
        except ApiError as e:
            if e.status != 409:
                raise

    def merge_patch(self, path: str, body: Obj) -> Any:
        return self.call("PATCH", path, body, content_type="application/merge-patch+json")


# --- Containers ---------------------------------------------------------------------------------


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`,
    and an undefined `$(VAR)` stays as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            end = text.find(")", i + 2) if text[i + 1] == "(" else -1
            if end != -1:
                out.append(env.get(text[i + 2 : end], text[i : end + 1]))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def env_from(container: Obj, get: Callable[[str, str], Obj | None]) -> dict[str, str]:
    """A container's `envFrom` as a kubelet reads it: each ConfigMap's or Secret's keys (after
    `prefix`), in order, a later source winning; `get(kind, name)` fetches the object. A missing
    source that is not `optional` raises LookupError, and the pod waits for it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind, ref = (
            ("configmaps", source["configMapRef"]) if "configMapRef" in source else ("secrets", source.get("secretRef"))
        )
        if ref is None:
            continue
        obj = get(kind, ref["name"])
        if obj is None:
            if ref.get("optional"):
                continue
            raise LookupError(f"{kind[:-1]} {ref['name']} of container {container['name']}'s envFrom not found")
        raw: dict[str, str] = obj.get("data") or {}
        data = {k: base64.b64decode(v).decode() for k, v in raw.items()} if kind == "secrets" else raw
        for key, value in data.items():
            if "=" in key:  # not a name a process environment can hold; a kubelet skips it too
                continue
            env[source.get("prefix", "") + key] = value
    return env


def field_ref(pod: Obj, path: str, ip: str, host_ip: str) -> str | None:
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": ip, "status.podIPs": ip, "status.hostIP": host_ip, "status.hostIPs": host_ip,
    }  # fmt: skip
    if path in simple:
        return simple[path]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    return meta.get(m.group(1), {}).get(m.group(2), "") if m else None


class Probe:
    """One probe's schedule and consecutive results."""

    def __init__(self, spec: Obj) -> None:
        self.spec = spec
        self.period = spec.get("periodSeconds", 10)
        self.timeout = spec.get("timeoutSeconds", 1)
        self.success_threshold = spec.get("successThreshold", 1)
        self.failure_threshold = spec.get("failureThreshold", 3)
        self.reset(time.monotonic())

    def reset(self, now: float) -> None:
        self.next_at = now + self.spec.get("initialDelaySeconds", 0)
        self.successes = self.failures = 0

    def due(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.period
        return True

    def record(self, ok: bool) -> None:
        self.successes, self.failures = (self.successes + 1, 0) if ok else (0, self.failures + 1)

    @property
    def succeeded(self) -> bool:
        return self.successes >= self.success_threshold

    @property
    def failed(self) -> bool:
        return self.failures >= self.failure_threshold


class Container:
    """One container of a pod: its process, restarts and probes."""

    def __init__(self, pod: PodRunner, spec: Obj, restart_count: int) -> None:
        self.pod = pod
        self.spec = spec
        self.name: str = spec["name"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_count = restart_count
        self.runs = 0
        self.state: Obj = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: Obj = {}
        self.next_start = 0.0
        self.started = self.ready = self.finished = False
        self.kill_deadline: float | None = None
        self.kill_reason = ""
        self.probes = {
            k: Probe(spec[f"{k}Probe"]) for k in ("startup", "liveness", "readiness") if spec.get(f"{k}Probe")
        }
        self.log_path = pod.agent.layout.logs_dir / pod.dir_name / f"{self.name}.log"
        self.env: dict[str, str] = {}  # once the pod has its IP (fieldRef status.podIP)
        self.env_from: dict[str, str] = {}  # read with the pod's volumes

    def _env(self) -> dict[str, str]:
        pod, agent = self.pod.pod, self.pod.agent
        env = {
            "PATH": f"{agent.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"],
            "HOME": "/root",
            **self.env_from,  # then `env`, which wins over it, as with a kubelet
        }
        for var in self.spec.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif (ref := var.get("valueFrom", {}).get("fieldRef")) is not None:
                value = field_ref(pod, ref["fieldPath"], self.pod.ip or "", agent.network.gateway)
                if value is None:
                    log.warning(
                        "%s: fieldRef %s not supported; %s left unset", self.pod.key, ref["fieldPath"], var["name"]
                    )
                else:
                    env[var["name"]] = value
            elif "valueFrom" in var:
                log.warning("%s: env %s: only value and fieldRef are supported; left unset", self.pod.key, var["name"])
            else:
                env[var["name"]] = ""
        return env

    def argv(self) -> list[str] | None:
        if not self.spec.get("command"):
            return None  # the image's entrypoint: there is no image
        return [expand(a, self.env) for a in [*self.spec["command"], *self.spec.get("args", [])]]

    def start(self, now: float) -> None:
        argv = self.argv()
        if argv is None:
            self.state = {
                "waiting": {"reason": "CreateContainerError", "message": "the dev node runs no images: set command"}
            }
            self.finished = True
            return
        # `ip netns exec` enters the pod's network namespace and a new mount namespace
        # (slave to the host's, so nothing mounted inside leaks out) with the pod's hosts
        # file over /etc/hosts; the shell bind-mounts the volumes, then becomes the container.
        # Every source (and what stands in for the image: the venv, the repository) is opened
        # before anything is mounted and bound through /proc/$$/fd: a volume mounted over /tmp
        # must not hide the next one's source, or the venv, when the repository lives under /tmp.
        mounts = sorted(self.pod.mounts(self.spec), key=lambda m: len(Path(m[1]).parts))
        keep = sorted(
            str(k)
            for k in {REPO, self.pod.agent.venv_bin.parent.parent}
            if any(Path(t) == k or Path(t) in k.parents for _, t, _ in mounts)
        )
        sources = [source for source, _, _ in mounts] + keep
        script = ["set -e"] + [f"exec {10 + i}<{shlex.quote(src)}" for i, src in enumerate(sources)]
        targets = [(target, read_only) for _, target, read_only in mounts] + [(k, False) for k in keep]
        for i, (target, read_only) in enumerate(targets):
            q_dst = shlex.quote(target)
            # --no-canonicalize: mount(8) would otherwise resolve the fd's link to its path text,
            # which by now may name the covered place instead.
            script += [f"mkdir -p {q_dst}", f"mount --no-canonicalize --bind /proc/$$/fd/{10 + i} {q_dst}"]
            if read_only:
                script.append(f"mount -o remount,bind,ro {q_dst}")
        script += [f"exec {10 + i}<&-" for i in range(len(sources))]
        script += [f"cd {shlex.quote(self.spec.get('workingDir') or '/')}", 'exec "$@"']
        command = [IP, "netns", "exec", self.pod.netns, "bash", "-c", "\n".join(script), "bash", *argv]
        cgroup = self.pod.agent.cpu.container(self.pod.uid, self.name, self.spec.get("resources", {}))
        if cgroup is not None:
            # Into its cgroup before `ip netns exec`, which mounts a /sys of its own: every
            # process of the container inherits it.
            command = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *command]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(
                f"--- {_now()} dev node: started {self.name} (run {self.runs + 1}): {shlex.join(argv)}\n".encode()
            )
            out.flush()
            # A session of its own: its process group is what is killed when it ends.
            self.proc = subprocess.Popen(
                command, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.pod.dir, start_new_session=True,
            )  # fmt: skip
        if cgroup is not None:
            # And from here, before the container is reported running: the shell above may not
            # have been scheduled yet, and a kubelet reports a container once it is in its cgroup.
            self.pod.agent.cpu.enter(cgroup, self.proc.pid)
        if self.runs:
            self.restart_count += 1
        self.runs += 1
        self.state = {"running": {"startedAt": _now()}}
        self.started = "startup" not in self.probes
        self.ready = False
        self.kill_deadline, self.kill_reason = None, ""
        for probe in self.probes.values():
            probe.reset(now)
        log.info("%s: started container %s (pid %d)", self.pod.key, self.name, self.proc.pid)

    def kill(self, reason: str, grace: float) -> None:
        """SIGTERM to the main process, as a kubelet signals a container's PID 1 (the
        tfdata-server supervisor stops its TensorFlow child itself); SIGKILL to the whole
        group once `grace` has passed."""
        if self.proc is None or self.kill_deadline is not None:
            return
        log.info("%s: stopping container %s: %s", self.pod.key, self.name, reason)
        self.kill_reason = reason
        self.kill_deadline = time.monotonic() + grace
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)

    def tick(self, now: float, may_start: bool) -> None:
        if self.proc is not None:
            returncode = self.proc.poll()
            if returncode is None:
                if self.kill_deadline is not None:
                    if now > self.kill_deadline:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self._probe(now)
                return
            self._exited(returncode, now)
        if may_start and not self.finished and now >= self.next_start:
            self.start(now)

    def _exited(self, returncode: int, now: float) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):  # what it left running dies with it, as in a cgroup
            os.killpg(self.proc.pid, signal.SIGKILL)
        code = returncode if returncode >= 0 else 128 - returncode
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.state.get("running", {}).get("startedAt"),
            "finishedAt": _now(),
            "containerID": f"devnode://{self.proc.pid}",
        }
        if self.kill_reason:
            terminated["message"] = self.kill_reason
        log.info(
            "%s: container %s exited with %d%s",
            self.pod.key,
            self.name,
            code,
            f" ({self.kill_reason})" if self.kill_reason else "",
        )
        self.proc = None
        self.started = self.ready = False
        policy = self.pod.pod["spec"].get("restartPolicy", "Always")
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            backoff = min(2.0 ** min(self.runs - 1, 4), BACKOFF_MAX_SECONDS)
            self.next_start = now + backoff
            self.last_state = {"terminated": terminated}
            self.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:.0f}s restarting container {self.name}",
                }
            }
        else:
            self.state = {"terminated": terminated}
            self.finished = True

    def _probe(self, now: float) -> None:
        grace = float(self.pod.pod["spec"].get("terminationGracePeriodSeconds", 30))
        if not self.started:
            startup = self.probes["startup"]
            if startup.due(now):
                startup.record(self.pod.check(self, startup))
            if startup.succeeded:
                self.started = True
                for kind in ("liveness", "readiness"):
                    if kind in self.probes:
                        self.probes[kind].reset(now)
            elif startup.failed:
                self.kill("Startup probe failed", grace)
            return
        liveness = self.probes.get("liveness")
        if liveness is not None and liveness.due(now):
            liveness.record(self.pod.check(self, liveness))
            if liveness.failed:
                self.kill("Liveness probe failed", grace)
                return
        readiness = self.probes.get("readiness")
        if readiness is None:
            self.ready = True
        elif readiness.due(now):
            readiness.record(self.pod.check(self, readiness))
            self.ready = readiness.succeeded or (self.ready and not readiness.failed)

    def status(self) -> Obj:
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": f"devnode://{self.proc.pid}" if self.proc else "",
            "ready": self.ready,
            "started": self.started and self.proc is not None,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }


# --- Pods ------------------------------------------------------------------------------------


class PodRunner(threading.Thread):
    """Everything a kubelet does for one pod (one uid), in a thread of its own."""

    def __init__(self, agent: Agent, pod: Obj) -> None:
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        super().__init__(name=self.key, daemon=True)
        self.agent = agent
        self.pod = pod  # the latest seen; replaced by the agent's loop
        self.uid: str = pod["metadata"]["uid"]
        self.dir_name = f"{pod['metadata']['namespace']}_{pod['metadata']['name']}"
        self.dir = agent.layout.pods_dir / self.dir_name
        self.ip: str | None = None
        self.netns = ""
        self.stop_request: tuple[float, bool] | None = None  # (grace seconds, delete the Pod afterwards)
        self.message = ""
        self.start_time = pod.get("status", {}).get("startTime") or _now()
        self.transitions: dict[str, tuple[str, str]] = {}
        self.reported: Obj | None = None
        self.volumes: dict[str, str] = {}  # volume name -> host directory
        previous = {c["name"]: c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", [])}
        # An agent restarted while the pod ran starts its containers again: that counts as a restart.
        self.containers = [
            Container(self, c, previous.get(c["name"], 0) + (c["name"] in previous)) for c in pod["spec"]["containers"]
        ]
        for kind in ("initContainers", "ephemeralContainers"):
            if pod["spec"].get(kind):
                log.warning("%s: %s are not supported; ignored", self.key, kind)

    def request_stop(self, grace: float, delete: bool) -> None:
        if self.stop_request is None:
            self.stop_request = (grace, delete)

    def run(self) -> None:
        delete = False
        try:
            if self._prepare():
                self._run_containers()
            grace, delete = self.stop_request or (0.0, False)
            self._stop_containers(grace)
        except Exception:
            log.exception("%s: failed", self.key)
        finally:
            self._teardown()
        if delete:
            ns, name = self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]
            with contextlib.suppress(ApiError):  # gone already, or a newer pod of that name: not ours
                self.agent.api.call(
                    "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                )  # fmt: skip
            log.info("%s: deleted the pod", self.key)

    def _prepare(self) -> bool:
        """Volumes and network; waits (Pending, with a message) while a claim is unbound."""
        while self.stop_request is None:
            try:
                self.volumes = self._resolve_volumes()
                for c in self.containers:
                    c.env_from = env_from(c.spec, self._get_object)
                break
            except LookupError as e:
                self.message = str(e)
                self.report()
                time.sleep(1)
        if self.stop_request is not None:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ip = self.agent.network.allocate(self.key, in_use=set(self.agent.runners))
        self.netns = self.agent.layout.netns(self.ip)
        self.agent.network.add(self.netns, self.ip)
        write_hosts(self.netns, self.agent.hosts_for(self.pod["metadata"]["namespace"]))
        self.message = ""
        for c in self.containers:
            c.env = c._env()
        log.info("%s: sandbox ready: %s in netns %s", self.key, self.ip, self.netns)
        return True

    def _get_object(self, kind: str, name: str) -> Obj | None:
        return self.agent.api.get(f"/api/v1/namespaces/{self.pod['metadata']['namespace']}/{kind}/{name}")

    def _resolve_volumes(self) -> dict[str, str]:
        ns = self.pod["metadata"]["namespace"]
        found: dict[str, str] = {}
        for vol in self.pod["spec"].get("volumes", []):
            name = vol["name"]
            local = self.dir / "volumes" / name
            if "emptyDir" in vol:
                local.mkdir(parents=True, exist_ok=True)
                found[name] = str(local)
            elif "hostPath" in vol:
                found[name] = vol["hostPath"]["path"]
            elif "configMap" in vol or "secret" in vol:
                kind, ref = ("configmaps", vol["configMap"]) if "configMap" in vol else ("secrets", vol["secret"])
                obj = self._get_object(kind, ref.get("name") or ref.get("secretName"))
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise LookupError(
                        f"{kind[:-1]} {ref.get('name') or ref.get('secretName')} of volume {name} not found"
                    )
                self._write_files(local, obj, ref.get("items"), binary=kind == "secrets")
                found[name] = str(local)
            elif "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                pvc = self.agent.api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
                pv_name = (pvc or {}).get("spec", {}).get("volumeName")
                pv = self.agent.api.get(f"/api/v1/persistentvolumes/{pv_name}") if pv_name else None
                if pv is None or (pvc or {}).get("status", {}).get("phase") != "Bound":
                    raise LookupError(f"claim {claim} of volume {name} is not bound yet")
                path = (pv["spec"].get("hostPath") or pv["spec"].get("local") or {}).get("path")
                if not path:
                    raise LookupError(f"volume {pv_name} of claim {claim} has no hostPath/local path")
                Path(path).mkdir(parents=True, exist_ok=True)
                found[name] = path
            else:
                log.warning(
                    "%s: volume %s: type %s is not supported; not mounted", self.key, name, sorted(set(vol) - {"name"})
                )
        return found

    @staticmethod
    def _write_files(directory: Path, obj: Obj, items: list[Obj] | None, binary: bool) -> None:
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()} if binary else {
            **{k: v.encode() for k, v in (obj.get("data") or {}).items()},
            **{k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()},
        }  # fmt: skip
        paths = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        directory.mkdir(parents=True, exist_ok=True)
        for key, rel in paths.items():
            if key in data:
                (directory / rel).parent.mkdir(parents=True, exist_ok=True)
                (directory / rel).write_bytes(data[key])

    def mounts(self, container: Obj) -> list[tuple[str, str, bool]]:
        result = []
        for m in container.get("volumeMounts", []):
            if m["name"] in self.volumes:
                source = self.volumes[m["name"]]
                if m.get("subPath"):
                    source = os.path.join(source, m["subPath"])
                    Path(source).mkdir(parents=True, exist_ok=True)
                result.append((source, m["mountPath"], bool(m.get("readOnly"))))
        return result

    def _run_containers(self) -> None:
        while self.stop_request is None:
            now = time.monotonic()
            for c in self.containers:
                c.tick(now, may_start=True)
            self.report()
            time.sleep(TICK_SECONDS)

    def _stop_containers(self, grace: float) -> None:
        for c in self.containers:
            c.kill("the pod is being deleted" if grace else "stopped", grace)
        deadline = time.monotonic() + grace + 5
        while any(c.proc is not None for c in self.containers) and time.monotonic() < deadline:
            for c in self.containers:
                c.tick(time.monotonic(), may_start=False)
            time.sleep(0.1)

    def _teardown(self) -> None:
        if self.netns:
            _kill_netns(self.netns)
        self.agent.cpu.remove(self.uid)
        shutil.rmtree(self.dir, ignore_errors=True)  # emptyDirs and configMap copies die with the pod

    def check(self, container: Container, probe: Probe) -> bool:
        spec = probe.spec
        try:
            if "httpGet" in spec:
                get = spec["httpGet"]
                host, port = get.get("host") or self.ip, self._port(container, get["port"])
                url = f"{get.get('scheme', 'HTTP').lower()}://{host}:{port}{get.get('path', '/')}"
                request = urllib.request.Request(
                    url, headers={h["name"]: h["value"] for h in get.get("httpHeaders", [])}
                )
                tls = ssl.create_default_context()
                tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE  # kubelets do not verify either
                opener = urllib.request.build_opener(
                    urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls)
                )
                with opener.open(request, timeout=probe.timeout) as response:
                    return 200 <= int(response.status) < 400
            if "tcpSocket" in spec:
                port = self._port(container, spec["tcpSocket"]["port"])
                with socket.create_connection((spec["tcpSocket"].get("host") or self.ip, port), timeout=probe.timeout):
                    return True
            if "exec" in spec:  # in the pod's network namespace, with the container's env
                argv = [IP, "netns", "exec", self.netns, *spec["exec"]["command"]]
                return (
                    subprocess.run(
                        argv, env=container.env, capture_output=True, timeout=probe.timeout, check=False
                    ).returncode
                    == 0
                )
        except (OSError, http.client.HTTPException, subprocess.TimeoutExpired):
            return False
        log.warning("%s: probe %s not supported; counted as passing", self.key, sorted(spec))
        return True

    @staticmethod
    def _port(container: Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in container.spec.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise OSError(f"no port named {port!r}")

    def _condition(self, kind: str, ok: bool, reason: str = "", message: str = "") -> Obj:
        status = "True" if ok else "False"
        if self.transitions.get(kind, ("", ""))[0] != status:
            self.transitions[kind] = (status, _now())
        condition = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self.transitions[kind][1],
        }
        if not ok and reason:
            condition.update(reason=reason, message=message)
        return condition

    def status(self) -> Obj:
        containers = [c.status() for c in self.containers]
        ready = all(c["ready"] for c in containers)
        if any(c.proc is not None or not c.finished for c in self.containers):
            phase = "Running" if any(c.runs for c in self.containers) else "Pending"
        else:
            phase = (
                "Succeeded"
                if all(c["state"].get("terminated", {}).get("exitCode") == 0 for c in containers)
                else "Failed"
            )
        scheduled = [c for c in self.pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"]
        not_ready = [c["name"] for c in containers if not c["ready"]]
        message = f"containers with unready status: [{' '.join(not_ready)}]"
        conditions = [
            *(scheduled or [self._condition("PodScheduled", True)]),
            self._condition("Initialized", self.ip is not None, "Waiting", self.message),
            self._condition("ContainersReady", ready, "ContainersNotReady", message),
            self._condition("Ready", ready, "ContainersNotReady", message),
        ]
        status: Obj = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.agent.network.gateway,
            "hostIPs": [{"ip": self.agent.network.gateway}],
            "startTime": self.start_time,
            "containerStatuses": containers,
        }
        if self.ip:
            status.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
        return status

    def report(self) -> None:
        status = self.status()
        if status == self.reported:
            return
        ns, name = self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]
        try:
            # A merge patch replaces lists whole: this writes all conditions and container statuses.
            self.agent.api.merge_patch(
                f"/api/v1/namespaces/{ns}/pods/{name}/status",
                {"metadata": {"uid": self.uid}, "status": status},  # the uid: never patch a newer pod of that name
            )
            self.reported = status
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("%s: status update failed: %s", self.key, e)
        except Exception as e:  # the API server restarting: try again next tick
            log.warning("%s: status update failed: %s", self.key, e)


# --- The agent --------------------------------------------------------------------------------


def _default_venv_bin() -> Path:
    venv = REPO / ".venv" / "bin"
    return venv if (venv / "python").exists() else Path(sys.executable).parent


class Agent:
    def __init__(self, state_dir: Path, kubeconfig: Path, node_name: str, venv_bin: Path) -> None:
        self.layout = Layout(state_dir)
        self.api = Api(kubeconfig)
        self.node_name = node_name
        self.venv_bin = venv_bin
        self.network = Network(self.layout)
        self.cpu = CpuLimits(self.layout)
        self.runners: dict[str, PodRunner] = {}
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.entries: tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]] = ({}, {})
        self.ready_since = _now()

    def hosts_for(self, namespace: str | None) -> str:
        return hosts_text(self.entries, namespace)

    # Start and stop.

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping.set()
        self.wake.set()

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        # A previous agent of this state dir may have died without cleaning up: its pods'
        # processes and namespaces go, and the pods bound here start again (same IPs).
        cleanup(self.layout.state_dir)
        self.network.setup()
        self.cpu.setup()
        self._register()
        # Pods of this node (start them at once) and claims (provision them before the scheduler looks).
        for path, selector in (("pods", f"spec.nodeName={self.node_name}"), ("persistentvolumeclaims", "")):
            threading.Thread(target=self._watch, args=(path, selector), name=f"watch {path}", daemon=True).start()
        log.info("node %s ready: pods on %s, state in %s", self.node_name, self.network.subnet, self.layout.node_dir)
        next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        while not self.stopping.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            try:
                self._sync()
                if time.monotonic() >= next_heartbeat:
                    self._heartbeat()
                    next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
            except Exception as e:  # the API server restarting, a watch broken: level-based, so retry
                log.warning("sync failed: %s", e)
                self.stopping.wait(1.0)
        self._shutdown()

    def _shutdown(self) -> None:
        log.info("stopping: %d pods", len(self.runners))
        for runner in self.runners.values():
            runner.request_stop(min(SHUTDOWN_GRACE_SECONDS, self._grace(runner.pod)), delete=False)
        for runner in self.runners.values():
            runner.join(SHUTDOWN_GRACE_SECONDS + 2)
        cleanup(self.layout.state_dir)
        log.info("stopped")

    # The Node.

    def _node_status(self) -> Obj:
        now = _now()
        ok = [("MemoryPressure", "KubeletHasSufficientMemory"), ("DiskPressure", "KubeletHasNoDiskPressure"),
              ("PIDPressure", "KubeletHasSufficientPID")]  # fmt: skip
        conditions = [
            {"type": t, "status": "False", "reason": r, "message": "dev node", "lastHeartbeatTime": now,
             "lastTransitionTime": self.ready_since} for t, r in ok
        ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "tfdata dev node is running pods",
              "lastHeartbeatTime": now, "lastTransitionTime": self.ready_since}]  # fmt: skip
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        return {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.network.gateway},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": self.layout.id,
                "systemUUID": self.layout.id,
                "bootID": self.ready_since,
                "kernelVersion": os.uname().release,
                "osImage": "tfdata dev node",
                "containerRuntimeVersion": "devnode://0",
                "kubeletVersion": "v0.0.0-devnode",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _register(self) -> None:
        labels = {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        self.api.create(
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name, "labels": labels}},
        )
        self._heartbeat()
        self.api.create(
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
                "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
            },
        )  # fmt: skip

    def _heartbeat(self) -> None:
        """Node status and Lease: without them the node lifecycle controller marks the node
        NotReady after ~40 s and taints it."""
        self.api.merge_patch(f"/api/v1/nodes/{self.node_name}/status", {"status": self._node_status()})
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node_name}"
        renew = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": self.node_name, "leaseDurationSeconds": 40, "renewTime": renew}
        if self.api.get(path) is None:
            self.api.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.node_name},
                    "spec": spec,
                },
            )
        else:
            self.api.merge_patch(path, {"spec": spec})

    # The loop.

    def _watch(self, resource: str, field_selector: str) -> None:
        """Wakes the loop as soon as something changes; the loop itself re-lists every second,
        so a broken watch only costs latency until it is re-established."""
        query = [("watch", "true"), ("fieldSelector", field_selector), ("timeoutSeconds", "300")]
        while not self.stopping.is_set():
            try:
                for _ in self.api.call("GET", f"/api/v1/{resource}", query=query, timeout=330, stream=True):
                    self.wake.set()
            except Exception as e:
                log.info("watch of %s ended (%s); watching again", resource, e)
                self.stopping.wait(1.0)

    def _sync(self) -> None:
        pods = self.api.call("GET", "/api/v1/pods")["items"]
        services = self.api.call("GET", "/api/v1/services")["items"]
        self._sync_pods([p for p in pods if p["spec"].get("nodeName") == self.node_name])
        self.entries = hosts_entries(pods, services)
        self._write_all_hosts()
        claims = self.api.call("GET", "/api/v1/persistentvolumeclaims")["items"]
        self._provision(claims)
        self._unstick(pods, claims)

    def _unstick(self, pods: list[Obj], claims: list[Obj]) -> None:
        """Binds to this node a pod the scheduler gave up on while its claims were being bound.

        kube-scheduler (1.34) sometimes misses the claim's update when it came while the pod
        was being scheduled, and then waits 5 minutes before it tries again (seen once in a
        few runs of a StatefulSet with a claim). No test should wait that out.
        """
        bound = {
            (c["metadata"]["namespace"], c["metadata"]["name"])
            for c in claims
            if c.get("status", {}).get("phase") == "Bound"
        }
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            claimed = [
                v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes", []) if "persistentVolumeClaim" in v
            ]
            scheduled = [c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"]
            if spec.get("nodeName") or not claimed or meta.get("deletionTimestamp") or not scheduled:
                continue
            if scheduled[0]["status"] != "False" or scheduled[0].get("reason") != "Unschedulable":
                continue
            since = datetime.strptime(scheduled[0]["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=timezone.utc
            )
            if (datetime.now(timezone.utc) - since).total_seconds() < 5:
                continue
            if all((meta["namespace"], c) in bound for c in claimed):
                with contextlib.suppress(ApiError):
                    self.api.call(
                        "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "uid": meta["uid"]},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}},
                    )  # fmt: skip
                    log.warning(
                        "%s/%s: unschedulable although its claims are bound now; bound it here",
                        meta["namespace"],
                        meta["name"],
                    )

    @staticmethod
    def _grace(pod: Obj) -> float:
        meta = pod["metadata"]
        value = meta.get("deletionGracePeriodSeconds", pod["spec"].get("terminationGracePeriodSeconds", 30))
        return float(value if value is not None else 30)

    def _sync_pods(self, pods: list[Obj]) -> None:
        seen = {}
        for pod in pods:
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            seen[key] = meta["uid"]
            runner = self.runners.get(key)
            if runner is not None and runner.uid != meta["uid"]:
                runner.request_stop(0, delete=False)  # an older pod of that name, force-deleted
                continue  # the new one starts once the old one is torn down
            if runner is None:
                if meta.get("deletionTimestamp") or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    if meta.get("deletionTimestamp"):  # nothing runs for it here: finish the deletion
                        with contextlib.suppress(ApiError):
                            self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                          {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})  # fmt: skip
                    continue
                runner = self.runners[key] = PodRunner(self, pod)
                log.info("%s: bound here; starting", key)
                runner.start()
            runner.pod = pod
            if meta.get("deletionTimestamp"):
                runner.request_stop(self._grace(pod), delete=True)
        for key, runner in list(self.runners.items()):
            if seen.get(key) != runner.uid:
                runner.request_stop(2, delete=False)  # gone from the API without us (force-deleted)
            if not runner.is_alive():  # done, or failed to set up (logged): the next sync starts it again
                del self.runners[key]

    def _write_all_hosts(self) -> None:
        targets = {r.netns: r.pod["metadata"]["namespace"] for r in self.runners.values() if r.netns}
        if self.layout.clients_dir.is_dir():
            for reg in self.layout.clients_dir.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    targets[reg.name] = json.loads(reg.read_text()).get("namespace")
        for netns, namespace in targets.items():
            text = self.hosts_for(namespace)
            # Compare with the file itself, not with what was last written: a namespace name
            # comes back when its IP is reused (a new client, a recreated pod) with a fresh file.
            with contextlib.suppress(OSError):
                if Path(f"/etc/netns/{netns}/hosts").read_text() != text and Path(f"/run/netns/{netns}").exists():
                    write_hosts(netns, text)

    def _provision(self, claims: list[Obj]) -> None:
        """Claims of the `standard` class get a directory and a PV pre-bound to them; PVs of
        deleted claims (Released) go, with their directory."""
        for pvc in claims:
            meta, spec = pvc["metadata"], pvc["spec"]
            if (
                pvc.get("status", {}).get("phase") != "Pending"
                or spec.get("volumeName")
                or spec.get("storageClassName") != STORAGE_CLASS
            ):
                continue
            name = f"pvc-{meta['uid']}"
            directory = self.layout.volumes_dir / name
            directory.mkdir(parents=True, exist_ok=True)
            pv = {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                "spec": {
                    "capacity": {"storage": spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                                 "name": meta["name"], "uid": meta["uid"]},
                    "storageClassName": STORAGE_CLASS, "persistentVolumeReclaimPolicy": "Delete",
                    "volumeMode": spec.get("volumeMode", "Filesystem"),
                },
            }  # fmt: skip
            self.api.create("/api/v1/persistentvolumes", pv)
            log.info("provisioned %s for claim %s/%s at %s", name, meta["namespace"], meta["name"], directory)
        for pv in self.api.call("GET", "/api/v1/persistentvolumes")["items"]:
            meta = pv["metadata"]
            ours = meta.get("annotations", {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER
            if not ours or pv.get("status", {}).get("phase") != "Released" or meta.get("deletionTimestamp"):
                continue
            if pv["spec"].get("persistentVolumeReclaimPolicy") != "Delete":
                continue
            with contextlib.suppress(ApiError):
                self.api.call("DELETE", f"/api/v1/persistentvolumes/{meta['name']}")
            path = pv["spec"].get("hostPath", {}).get("path", "")
            if path.startswith(str(self.layout.volumes_dir) + os.sep):
                shutil.rmtree(path, ignore_errors=True)
            log.info("deleted %s: its claim is gone", meta["name"])


# --- Clients ------------------------------------------------------------------------------------


@contextlib.contextmanager
def client_netns(state_dir: Path, namespace: str = "default", timeout: float = 15) -> Iterator[list[str]]:
    """A fresh network namespace on the cluster's bridge, whose /etc/hosts (kept current by
    the agent) resolves the cluster's Services and pod names; yields the command prefix
    (`ip netns exec NAME`) and removes the namespace afterwards, with whatever still runs in it.
    Short names (`<svc>`) resolve in `namespace`."""
    layout = Layout(state_dir)
    network = Network(layout)
    if network.subnet is None or not Path(f"/run/netns/{layout.bridge_ns}").exists():
        raise RuntimeError(f"no node agent runs for {layout.state_dir} (start the cluster with the node)")
    key = f"client/{secrets.token_hex(4)}"
    ip = network.allocate(key)
    netns = layout.netns(ip)
    registration = layout.clients_dir / netns
    try:
        network.add(netns, ip)
        write_hosts(netns, "127.0.0.1\tlocalhost\n")
        layout.clients_dir.mkdir(parents=True, exist_ok=True)
        registration.write_text(json.dumps({"namespace": namespace}) + "\n")
        deadline = time.monotonic() + timeout
        while not Path(f"/etc/netns/{netns}/hosts").read_text().startswith(HOSTS_HEADER):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node agent did not write the hosts file of {netns} within {timeout:.0f}s")
            time.sleep(0.1)
        yield [IP, "netns", "exec", netns]
    finally:
        registration.unlink(missing_ok=True)
        _kill_netns(netns)
        network.release(key)


def client_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a client command: the project's venv first on PATH, and no proxy (gRPC
    would send the cluster's traffic to it)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if "proxy" not in k.lower()}
    env["PATH"] = f"{_default_venv_bin()}:{env.get('PATH', '')}"
    return env


# --- Command line -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="be the node (devcluster's NODE_AGENT component runs this)")
    client = sub.add_parser("client", help="run a command in a client network namespace of the cluster")
    clean = sub.add_parser("cleanup", help="remove a cluster's namespaces, links and processes")
    for p in (run, client, clean):
        p.add_argument("--state-dir", type=Path, default=REPO / ".local")
    run.add_argument(
        "--kubeconfig", type=Path, help="default: STATE_DIR/kubeconfig (admin: it creates PVs and a StorageClass)"
    )
    run.add_argument("--node-name", default=NODE_NAME)
    run.add_argument("--venv-bin", type=Path, default=_default_venv_bin(), help="first on the containers' PATH")
    client.add_argument("--namespace", default="default", help="where short Service names resolve")
    client.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.command == "run":
        Agent(args.state_dir, args.kubeconfig or args.state_dir / "kubeconfig", args.node_name, args.venv_bin).run()
    elif args.command == "cleanup":
        cleanup(args.state_dir)
    else:
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("client: no command given (client --state-dir DIR -- COMMAND ...)")
        with client_netns(args.state_dir, args.namespace) as prefix:
            return subprocess.run([*prefix, *command], env=client_env(), check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
