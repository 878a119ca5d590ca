"""The dev cluster is a package at the repository's root (devcluster/, on pytest.ini's pythonpath):
every name its callers use as `devcluster.<name>` or on the node agent is one it exports."""

from __future__ import annotations

import re

import devcluster
from devcluster import node
from fixtures.cases import ROOT

# Where the dev cluster is used: the tests, the benchmarks and the package itself (the demo).
CALLERS = ("tests", "benchmarks", "devcluster")
NODE_ALIAS = re.compile(r"^from devcluster import node as (\w+)$", re.M)


def used_names() -> dict[str, set[str]]:
    """`devcluster.<name>` in every caller, and `<alias>.<name>` where a file imports the node agent as <alias>."""
    used: dict[str, set[str]] = {"devcluster": set(), "node": set()}
    for path in (p for directory in CALLERS for p in (ROOT / directory).rglob("*.py")):
        text = path.read_text()
        used["devcluster"] |= set(re.findall(r"\bdevcluster\.(\w+)", text))
        for alias in NODE_ALIAS.findall(text):
            used["node"] |= set(re.findall(rf"\b{alias}\.(\w+)", text))
    return used


def is_submodule(name: str) -> bool:
    return (ROOT / "devcluster" / f"{name}.py").exists() or (ROOT / "devcluster" / name / "__init__.py").exists()


def test_every_name_the_callers_use_is_exported() -> None:
    used = used_names()
    # The scan sees the callers: today's tiers use these.
    assert {"up", "down", "Cluster", "COMPONENTS_WITH_NODE"} <= used["devcluster"], used["devcluster"]
    assert {"client_netns", "client_env", "leftovers"} <= used["node"], used["node"]
    missing = [f"devcluster.{n}" for n in sorted(used["devcluster"]) if not (hasattr(devcluster, n) or is_submodule(n))]
    missing += [f"devcluster.node.{n}" for n in sorted(used["node"]) if not hasattr(node, n)]
    assert not missing, f"used but not exported by devcluster/__init__.py or devcluster/node/__init__.py: {missing}"


def _pod(name: str, ip: str, ready: bool = True) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": {"app": "d"}},
        "spec": {},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_a_services_name_outlives_its_pods_as_a_cluster_ip_does() -> None:
    """A dispatcher pod deleted and not back yet: its Service's name still resolves, to the address
    the pod comes back at, so a worker's channel reconnects without resolving again."""
    service = {"metadata": {"name": "d", "namespace": "ml"}, "spec": {"selector": {"app": "d"}}}
    headless = {"metadata": {"name": "h", "namespace": "ml"}, "spec": {"selector": {"app": "d"}, "clusterIP": "None"}}
    last: dict[tuple[str, str], list[str]] = {}
    everywhere, local = node.hosts_entries([_pod("d-0", "10.0.0.7")], [service, headless], last)
    assert everywhere["d.ml.svc.cluster.local"] == ["10.0.0.7"] and local["ml"]["h"] == ["10.0.0.7"]
    everywhere, local = node.hosts_entries([], [service, headless], last)
    assert everywhere["d.ml.svc.cluster.local"] == ["10.0.0.7"] and local["ml"]["d"] == ["10.0.0.7"]
    assert "h" not in local["ml"], "a headless Service names only the pods it has"
    everywhere, _ = node.hosts_entries([_pod("d-0", "10.0.0.9", ready=False)], [service], last)
    assert everywhere["d.ml.svc.cluster.local"] == ["10.0.0.9"]
    node.hosts_entries([], [], last)
    assert last == {}, "a deleted Service is forgotten"
