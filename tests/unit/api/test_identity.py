"""The identity of the custom resources (api/identity.py) against what the tests spell and the CRDs serve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tfdata_operator.api import identity

from fixtures.cases import CRD_PATH, SNAPSHOT_CRD_PATH
from fixtures.hostile import hostile_service
from fixtures.manifests import API_VERSION


@pytest.mark.parametrize("crd", [CRD_PATH, SNAPSHOT_CRD_PATH], ids=lambda p: p.name)
def test_the_tests_api_version_is_the_one_the_operator_writes_and_the_crd_stores(crd: Path) -> None:
    spec = yaml.safe_load(crd.read_text())["spec"]
    (stored,) = [v["name"] for v in spec["versions"] if v["storage"]]
    assert API_VERSION == identity.API_VERSION == f"{spec['group']}/{stored}"


def test_the_hostile_cases_spell_the_same_api_version() -> None:
    """tests/fixtures/hostile.py writes it out (it runs alone in a pod, without the tests' helpers)."""
    assert hostile_service("h", "ns", "drip", "", "img")["apiVersion"] == API_VERSION
