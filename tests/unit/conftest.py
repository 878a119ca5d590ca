"""Fixtures for the pure unit tests (their TFDataService bodies and specs come from tests/cases.py)."""

from __future__ import annotations

import pytest

from tfdata_operator.render.builders import BuildSettings


@pytest.fixture
def settings() -> BuildSettings:
    return BuildSettings(cluster_domain="cluster.local")
