"""Fixtures for the tests that need a real kind cluster (kind/cluster.sh up).

They run against the cluster named by $TFDATA_TEST_KUBECONFIG, with the operator already
installed there by its Helm chart and the server image loaded into the node:

    make kind-up
    TFDATA_TEST_KUBECONFIG=.local/kind-kubeconfig pytest -m kind tests/kind

Without $TFDATA_TEST_KUBECONFIG they fail saying so. `kubectl` comes from tests/fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import Kubectl

from fixtures.cluster import create_namespace


@pytest.fixture(scope="module")
def namespace(request: pytest.FixtureRequest, kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace for the test module, deleted afterwards (claims and all)."""
    kubectl.run("get", "crd", "tfdataservices.tfdata.dev")  # the chart installed the CRD
    name = create_namespace(request, kubectl, "k", 60)
    yield name
    # The TFDataService first, while the operator runs, then the namespace.
    kubectl.run(
        "delete", "tfdataservices", "--all", "-n", name, "--wait=true", "--timeout=120s", check=False, timeout=130
    )
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")
