"""spec.snapshots (api/spec/snapshots.py): which directories and claims are refused, in whole sentences."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.api import spec

from fixtures.cases import parse

CLAIM = {"claimName": "shared-data"}


def refusal(snapshots: dict[str, Any]) -> list[str]:
    with pytest.raises(spec.SpecError) as err:
        parse(snapshots=snapshots)
    return err.value.problems


@pytest.mark.parametrize(
    ("snapshots", "problems"),
    [
        ({}, ["spec.snapshots.directory is required: where the snapshots go (gs://bucket/path or /path)"]),
        # A directory that is there but wrong is named for what is wrong, not as missing.
        ({"directory": 5}, ["spec.snapshots.directory must be a string, got the number 5"]),
        ({"directory": ""}, ["spec.snapshots.directory must be 1 to 1024 characters long, got 0"]),
    ],
    ids=["missing", "a-number", "empty"],
)
def test_a_missing_directory_is_required_and_a_wrong_one_is_named_for_what_is_wrong(
    snapshots: dict[str, Any], problems: list[str]
) -> None:
    assert refusal(snapshots) == problems


@pytest.mark.parametrize(
    ("volume", "problems"),
    [
        ({}, ["spec.snapshots.volume.claimName is required: the ReadWriteMany claim to mount at the directory"]),
        # A claim name that is there but wrong is named for what is wrong, not as missing.
        (
            {"claimName": "Shared_Data"},
            [
                "spec.snapshots.volume.claimName has an invalid value 'Shared_Data': it must be a Kubernetes object "
                "name (lowercase letters, digits, '-' and '.')"
            ],
        ),
    ],
    ids=["no-claim", "a-bad-claim"],
)
def test_a_snapshot_volume_needs_a_valid_claim_name(volume: dict[str, Any], problems: list[str]) -> None:
    assert refusal({"directory": "/snapshots", "volume": volume}) == problems


@pytest.mark.parametrize("directory", ["/", "//", "/tmp", "/tmp/", "/var/lib/tfdata", "/var/lib/tfdata/"])
def test_a_snapshot_volume_is_refused_where_the_pods_mount_their_own(directory: str) -> None:
    assert refusal({"directory": directory, "volume": CLAIM}) == [
        f"spec.snapshots.directory must not be {directory} when a volume is mounted there: the pods need it "
        "for themselves. Use another path, such as /snapshots"
    ]


@pytest.mark.parametrize("directory", ["/tmpX", "/var/lib/tfdataX", "/snapshots/"])
def test_a_snapshot_volume_beside_or_under_the_pods_own_mounts_is_accepted(directory: str) -> None:
    assert parse(snapshots={"directory": directory, "volume": CLAIM}).snapshots == spec.SnapshotsSpec(
        directory, claim_name="shared-data"
    )
