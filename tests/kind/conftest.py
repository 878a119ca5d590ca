"""Fixtures for the tests that need a real kind cluster (hack/kind/cluster.sh up).

They run against the cluster named by $TFDATA_TEST_KUBECONFIG, with the operator already
installed there by its Helm chart and the server image loaded into the node:

    make kind-up
    TFDATA_TEST_KUBECONFIG=.local/kind-kubeconfig pytest -m kind tests/kind

Without $TFDATA_TEST_KUBECONFIG they are skipped. Every test here is marked `kind`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import integration_conftest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
KUBECONFIG_ENV = "TFDATA_TEST_KUBECONFIG"
# The integration tier's kubectl helper, so the tiers drive kubectl one way.
Kubectl = integration_conftest().Kubectl


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kind: needs a kind cluster with the operator installed (tests/kind)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.kind)


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    kubeconfig = os.environ.get(KUBECONFIG_ENV)
    if not kubeconfig:
        pytest.skip(f"set {KUBECONFIG_ENV} to a kind cluster's kubeconfig (make kind-up writes .local/kind-kubeconfig)")
    bin_dir = subprocess.run(
        [str(REPO / "hack" / "k8s-binaries.sh"), "--print"], capture_output=True, text=True, check=True
    ).stdout.strip()
    binary = Path(bin_dir) / "kubectl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
    env["KUBECONFIG"] = str(Path(kubeconfig).resolve())
    k = Kubectl(binary=binary if binary.exists() else Path("kubectl"), env=env)
    k.run("get", "crd", "tfdataservices.tfdata.dev")  # the chart installed the CRD
    return k


@pytest.fixture(scope="module")
def namespace(request: pytest.FixtureRequest, kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace for the test module, deleted afterwards (claims and all)."""
    name = integration_conftest().create_namespace(request, kubectl, "k", 60)
    yield name
    # The TFDataService first, while the operator runs, then the namespace.
    kubectl.run(
        "delete", "tfdataservices", "--all", "-n", name, "--wait=true", "--timeout=120s", check=False, timeout=130
    )
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")
