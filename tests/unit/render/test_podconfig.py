"""The dispatcher's server configuration (``render/podconfig.py``): the owner marker of a user's workDir."""

from __future__ import annotations

import pytest

from tfdata_operator.render import podconfig
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import parse


@pytest.mark.parametrize(
    ("work_dir", "marker"),
    [
        ("/shared/journal/", "/shared/journal/tfdata-owner"),
        ("gs://bucket/journal//", "gs://bucket/journal/tfdata-owner"),
        # Only slashes go: a last component that ends in another character is kept whole.
        ("/shared/journalX", "/shared/journalX/tfdata-owner"),
        ("gs://bucket/X/", "gs://bucket/X/tfdata-owner"),
    ],
)
def test_the_owner_marker_is_in_the_users_work_dir_as_written_less_its_trailing_slashes(
    settings: BuildSettings, work_dir: str, marker: str
) -> None:
    svc = parse(shardingPolicy="DYNAMIC", dispatcher={"workDir": work_dir})
    config = podconfig.dispatcher_config(svc, settings, 2)
    assert (config.owner, config.owner_marker) == ("ml/demo", marker)
    config.validate()  # the dispatcher accepts the marker where the operator put it
