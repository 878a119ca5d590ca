"""Fixtures for the pure unit tests: TFDataService bodies and parsed specs."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator import spec
from tfdata_operator.builders import BuildSettings

IMAGE = "tfdata-server:test"


def body(name: str = "demo", namespace: str = "ml", generation: int = 1, **spec_fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tfdata.dev/v1alpha1",
        "kind": "TFDataService",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": generation},
        "spec": spec_fields,
    }


def parse(generation: int = 1, **spec_fields: Any) -> spec.ServiceSpec:
    return spec.parse(body(generation=generation, **spec_fields), IMAGE)


@pytest.fixture
def settings() -> BuildSettings:
    return BuildSettings(cluster_domain="cluster.local")
