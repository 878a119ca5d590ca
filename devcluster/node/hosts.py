"""The hosts files that stand in for cluster DNS: for every pod and client network
namespace, /etc/netns/<netns>/hosts (which `ip netns exec` binds over /etc/hosts) names
the Services and the pod hostnames of headless Services."""

from __future__ import annotations

from pathlib import Path

from .api import Obj

CLUSTER_DOMAIN = "cluster.local"
HOSTS_HEADER = "# Written by the tfdata dev node (devcluster/node); rewritten as pods and services change.\n"


def _matches(selector: dict[str, str] | None, labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())


def _is_ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def hosts_entries(
    pods: list[Obj], services: list[Obj], last: dict[tuple[str, str], list[str]] | None = None
) -> tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    """(name -> IPs valid in every namespace, namespace -> name -> IPs of short names).

    ``last`` (kept by the caller between calls, updated here) remembers the address each
    non-headless Service last named: while none of its pods is there (a dispatcher pod deleted and
    not yet back), its name still resolves to it, as a Service's ClusterIP outlives its pods on a
    cluster. A StatefulSet pod comes back at the same address (``network.allocate``), so clients
    reconnect once it serves, without resolving the name again."""
    last = {} if last is None else last
    for gone in set(last) - {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services}:
        del last[gone]
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
        if not headless:
            ips = ips or last.get((ns, name), [])
            last[(ns, name)] = ips
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
