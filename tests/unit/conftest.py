"""Fixtures for the pure unit tests (their TFDataService bodies and specs come from tests/cases.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tfdata_operator.controller import probes
from tfdata_operator.render.builders import BuildSettings


@pytest.fixture
def settings() -> BuildSettings:
    return BuildSettings(cluster_domain="cluster.local")


@pytest.fixture(autouse=True)
def no_server_info_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The reconciles here run against pod IPs that are not ours (10.0.0.x): a test that does not
    give the readers its own ``read_server_info`` must not send one there. Calls are recorded and
    fail the test (the read runs in a background thread, where an exception would be lost)."""
    asked: list[str] = []
    monkeypatch.setattr(probes, "read_server_info", lambda url, timeout=0.0: asked.append(url))
    yield asked
    assert not asked, f"a unit test asked {asked} over the network: give the readers a read_server_info"
