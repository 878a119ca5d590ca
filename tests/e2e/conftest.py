"""Fixtures for end-to-end tests: dispatcher and worker pods that really run
`tfdata-server` with TensorFlow, and real tf.data clients.

By default the session starts its own cluster WITH the dev node (hack/nodeagent.py)
in `.local/e2e-cluster-<pid>` and stops it at the end (the state dir, with the
components' and pods' logs, is kept when a test failed). To use an existing cluster
instead, name its kubeconfig, as for tests/integration:

    TFDATA_TEST_KUBECONFIG=.local/kubeconfig pytest tests/e2e

Clients run in a network namespace of the dev node (`nodeagent.client_netns`), which
resolves the cluster's Service and pod names. That works for a cluster started with
`hack/devcluster.py up --node` (`make dev-cluster`): its state dir is the kubeconfig's
directory. On any other cluster (kind, ...) the pods' network is not reachable from
here, and tests that need the `client` fixture are skipped.

Every test under tests/e2e is marked `e2e`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nodeagent
import pytest
from support import OperatorProcess, integration_conftest

import devcluster  # hack/ is on pytest.ini's pythonpath

HERE = Path(__file__).resolve().parent

# The integration tier's kubectl helper and fixtures, on this tier's `cluster`.
_integration = integration_conftest()
Kubectl = _integration.Kubectl
kube_env = _integration.kube_env
kubectl = _integration.kubectl
namespace = _integration.namespace
crd = _integration.crd


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The `e2e` marker is registered in pytest.ini.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[devcluster.Cluster]:
    """The cluster named by $TFDATA_TEST_KUBECONFIG, else a fresh one with the dev node."""
    yield from _integration.session_cluster(request, "e2e-cluster", devcluster.COMPONENTS_WITH_NODE)


@pytest.fixture(scope="session")
def node_state_dir(cluster: devcluster.Cluster) -> Path | None:
    """The state dir of the dev node running the pods, if the cluster has one."""
    state_dir = cluster.state_dir or cluster.kubeconfig.parent
    return state_dir if (state_dir / "node" / "network.json").exists() else None


@pytest.fixture(scope="module")
def operator(
    crd: None, namespace: str, kube_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """`tfdata-operator run` as a process, watching the module's namespace only (so it
    cannot fight an operator already running in an existing cluster)."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    process = OperatorProcess(kube_env, log, f"--namespace={namespace}").start()
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.tail(80)


@dataclass(frozen=True)
class Client:
    """Runs Python programs (TensorFlow clients) where the cluster's names resolve."""

    state_dir: Path
    namespace: str

    def run(self, program: str, *args: str, timeout: float = 180) -> str:
        """The program's stdout; fails showing its output if it exits non-zero or runs too long."""
        with nodeagent.client_netns(self.state_dir, self.namespace) as prefix:
            try:
                result = subprocess.run(
                    [*prefix, "python", "-c", program, *args],
                    env=nodeagent.client_env(),
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired as e:
                out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
                err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
                raise AssertionError(
                    f"client ran over {timeout:.0f}s\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
                ) from e
        if result.returncode != 0:
            raise AssertionError(
                f"client exited with {result.returncode}\n"
                f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-5000:]}"
            )
        return result.stdout


@pytest.fixture(scope="module")
def client(node_state_dir: Path | None, namespace: str) -> Client:
    if node_state_dir is None:
        pytest.skip("clients need the dev node's network: use a cluster from `hack/devcluster.py up --node`")
    return Client(node_state_dir, namespace)
