"""Names and addresses of one cluster's node: its state directories, the network
namespaces of its bridge, pods and clients, and the IPs they get on the bridge's /24.

Names are derived from the state dir, so several clusters run side by side (see the
package's docstring); `cleanup` and `leftovers` are what `devcluster down` and the test
tiers call to remove and to check for what a node left on the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from .cpu import CPU_CGROUP_ROOT, remove_cgroups

IP = shutil.which("ip") or "/usr/sbin/ip"


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


def kill_netns(name: str) -> None:
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
        kill_netns(netns)  # a leftover of the same name (an agent killed mid-teardown)
        _run(IP, "netns", "add", netns)
        peer = f"p{ip.rsplit('.', 1)[1]}"
        # The namespace this IP had before (deleted a moment ago: clients come and go) may leave its
        # veth behind for a while, as the kernel frees a deleted namespace's devices asynchronously:
        # "RTNETLINK answers: File exists" for a trainer started right after another. The IP is
        # this caller's now, so the leftover goes.
        _run(IP, "-n", self.layout.bridge_ns, "link", "del", peer, check=False)
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
            kill_netns(name)
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
