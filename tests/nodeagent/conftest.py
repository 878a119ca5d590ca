"""Fixtures for the dev cluster's node (devcluster.node) tested on its own.

The session starts a fresh control plane with the node in `.local/nodeagent-<pid>` (its row in
tests/fixtures/tiers.py) and stops it after the tier's last test, failing if `down` left
anything behind; the state dir (components' and pods' logs) is kept when a test failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import devcluster


@pytest.fixture(scope="module")
def state_dir(cluster: devcluster.Cluster) -> Path:
    assert cluster.state_dir is not None
    return cluster.state_dir
