"""Fixtures for end-to-end tests: dispatcher and worker pods that really run `tfdata-server`
with TensorFlow, and real tf.data clients.

By default the session starts its own cluster WITH the dev node (devcluster.node) in
`.local/e2e-cluster-<pid>` and stops it at the end (the state dir, with the components' and
pods' logs, is kept when a test failed). To use an existing cluster instead, name its
kubeconfig, as for tests/integration:

    TFDATA_TEST_KUBECONFIG=.local/kubeconfig pytest tests/e2e

Clients run in a network namespace of the dev node (`nodeagent.client_netns`), which resolves
the cluster's Service and pod names. That works for a cluster started with
`python -m devcluster up --node` (`make dev-cluster`): its state dir is the kubeconfig's
directory. On any other cluster (kind, ...) the pods' network is not reachable from here, and
the tests fail saying so. The shared fixtures (`cluster`, `kubectl`,
`namespace`, `operator`) come from tests/fixtures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import devcluster


@pytest.fixture(scope="module")
def node_state_dir(cluster: devcluster.Cluster) -> Path:
    """The state dir of the dev node running the pods; fails when the cluster has none."""
    state_dir = cluster.state_dir or cluster.kubeconfig.parent
    network = state_dir / "node" / "network.json"
    if not network.exists():
        pytest.fail(
            f"the e2e tests need the dev node's network, and {network} does not exist: run them on a cluster "
            "from `python -m devcluster up --node` (the default, without TFDATA_TEST_KUBECONFIG)"
        )
    return state_dir
