"""Fixtures for the dev cluster's node (hack/nodeagent.py) tested on its own.

The session starts a fresh control plane with the node in `.local/nodeagent-<pid>` and
stops it at the end; the state dir (components' and pods' logs) is kept when a test
failed. Every test here is marked `nodeagent`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import nodeagent
import pytest
from support import ROOT, integration_conftest

import devcluster  # hack/ is on pytest.ini's pythonpath

HERE = Path(__file__).resolve().parent

# The integration tier's kubectl helper and fixtures, on this tier's `cluster`.
_integration = integration_conftest()
Kubectl = _integration.Kubectl
kube_env = _integration.kube_env
kubectl = _integration.kubectl
namespace = _integration.namespace


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nodeagent: the dev cluster's node agent against a real control plane")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.nodeagent)


def stop_abandoned(prefix: str) -> None:
    """Clusters of sessions that died without teardown would run forever; their logs stay."""
    for state_dir in (ROOT / ".local").glob(f"{prefix}-*"):
        pid = state_dir.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and (state_dir / "run").exists():
            devcluster.down(state_dir)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[devcluster.Cluster]:
    """A fresh control plane with the node, for this session."""
    stop_abandoned("nodeagent")
    state_dir = ROOT / ".local" / f"nodeagent-{os.getpid()}"
    try:
        yield devcluster.up(state_dir, devcluster.COMPONENTS_WITH_NODE)
    finally:
        devcluster.down(state_dir)
        left = {k: v for k, v in nodeagent.leftovers(state_dir).items() if v}
        if request.session.testsfailed or left:
            print(f"\nThe node tests' logs are in {state_dir / 'logs'}", file=sys.stderr)
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
        assert not left, f"`down` left these behind: {left}"


@pytest.fixture(scope="session")
def state_dir(cluster: devcluster.Cluster) -> Path:
    assert cluster.state_dir is not None
    return cluster.state_dir
