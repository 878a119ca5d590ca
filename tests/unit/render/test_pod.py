"""The pod template both servers' StatefulSets share (``render/pod.py``): where it mounts the snapshots' volume."""

from __future__ import annotations

import pytest

from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import parse


@pytest.mark.parametrize(
    ("directory", "mounted_at"),
    [
        ("/shared/snapshots/", "/shared/snapshots"),
        ("/shared/snapshots//", "/shared/snapshots"),
        # Only slashes go: a last component that ends in another character is kept whole.
        ("/shared/snapshotX", "/shared/snapshotX"),
        ("/shared/X/", "/shared/X"),
    ],
)
def test_the_snapshots_claim_is_mounted_at_the_directory_less_its_trailing_slashes(
    settings: BuildSettings, directory: str, mounted_at: str
) -> None:
    svc = parse(shardingPolicy="DYNAMIC", snapshots={"directory": directory, "volume": {"claimName": "shared-data"}})
    for sts in (
        builders.build_dispatcher_statefulset(svc, settings, 2),
        builders.build_worker_statefulset(svc, settings, 2),
    ):
        mounts = sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "snapshots", "mountPath": mounted_at} in mounts
