"""Fixtures for the tests that need a real kind cluster (kind/cluster.sh up).

They run against the cluster named by $TFDATA_TEST_KUBECONFIG, with the operator already
installed there by its Helm chart and the server image loaded into the node:

    make kind-up
    TFDATA_TEST_KUBECONFIG=.local/kind-kubeconfig pytest -m kind tests/kind

Without $TFDATA_TEST_KUBECONFIG they fail saying so. `kubectl` comes from tests/fixtures.
Every module's namespace starts the tier's one pod watch (`pod_health`, podhealth.py) first;
test_pods_stayed_healthy.py, which reads what it saw, runs after every other kind test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from podhealth import PodHealth

from fixtures.cluster import DELETED_NAMESPACES, create_namespace
from fixtures.support import Kubectl

HERE = Path(__file__).resolve().parent
LAST = HERE / "test_pods_stayed_healthy.py"
# Freezes nodes: after every other kind test (it thaws them, but a frozen node's pods restart).
NODE_LOSS = HERE / "test_node_loss.py"
POD_HEALTH = pytest.StashKey[PodHealth]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Moves the node-loss tests after the tier's other tests, and the pod health check right after
    them."""
    items[:] = [item for item in items if item.path != NODE_LOSS] + [item for item in items if item.path == NODE_LOSS]
    last = [item for item in items if item.path == LAST]
    rest = [item for item in items if item.path != LAST]
    kind = [n for n, item in enumerate(rest) if item.path.parent == HERE]
    at = kind[-1] + 1 if kind else len(rest)
    items[:] = rest[:at] + last + rest[at:]


@pytest.fixture(scope="module")
def pod_health(request: pytest.FixtureRequest, kubectl: Kubectl) -> PodHealth:
    """The watch on the operator's and the servers' pods, started by the tier's first module and
    kept until the session ends (podhealth.py)."""
    stash = request.config.stash
    if POD_HEALTH not in stash:
        health = PodHealth(Path(kubectl.env["KUBECONFIG"]))
        health.start()
        request.config.add_cleanup(health.stop)
        stash[POD_HEALTH] = health
    return stash[POD_HEALTH]


@pytest.fixture(scope="module")
def namespace(request: pytest.FixtureRequest, kubectl: Kubectl, pod_health: PodHealth) -> Iterator[str]:
    """A fresh namespace for the test module, deleted afterwards (claims and all)."""
    kubectl.run("get", "crd", "tfdataservices.tfdata.dev")  # the chart installed the CRD
    name = create_namespace(request, kubectl, "k", 60)
    pod_health.add_namespace(name)
    yield name
    # The TFDataService first, while the operator runs, then the namespace.
    kubectl.run(
        "delete", "tfdataservices", "--all", "-n", name, "--wait=true", "--timeout=120s", check=False, timeout=130
    )
    # Not waited for here (the next module starts at once); the tier's last module fails on one stuck.
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")
    request.config.stash.setdefault(DELETED_NAMESPACES, []).append(name)
