"""spec/checks.py: the checks across sections, here the dispatcher's journal against spec.snapshots,
with the whole sentence of each refusal."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.api import spec

from fixtures.cases import parse

TRAILER = (
    "where trainers read and delete snapshots: a DELETE of a snapshot there could remove the journal. Set "
    "spec.dispatcher.workDir (or spec.snapshots.directory) so that neither lies inside the other"
)


@pytest.mark.parametrize(
    ("dispatcher", "directory", "journal"),
    [
        ({"workDir": "gs://bucket/journal"}, "gs://bucket/journal/", "gs://bucket/journal, spec.dispatcher.workDir"),
        ({}, "/var/lib/tfdata/journal", "/var/lib/tfdata/journal, its default"),
    ],
    ids=["work-dir", "default"],
)
def test_a_snapshot_directory_that_is_the_journal_itself_is_refused(
    dispatcher: dict[str, Any], directory: str, journal: str
) -> None:
    with pytest.raises(spec.SpecError) as err:
        parse(dispatcher=dispatcher, snapshots={"directory": directory})
    assert err.value.problems == [
        f"the dispatcher's journal ({journal}) is the same as spec.snapshots.directory {directory}, {TRAILER}"
    ]


def test_snapshots_on_a_dispatcher_that_journals_nowhere_are_refused_for_the_missing_journal_alone() -> None:
    """No workDir and no journal volume: there is no journal to compare the directory with."""
    with pytest.raises(spec.SpecError) as err:
        parse(
            dispatcher={"faultTolerantMode": False, "storage": {"enabled": False}},
            snapshots={"directory": "/var/lib/tfdata/journal"},
        )
    assert err.value.problems == [
        "spec.snapshots needs spec.dispatcher.faultTolerantMode true: TensorFlow refuses a snapshot "
        "(distributed_save) on a dispatcher without a journal. Set faultTolerantMode to true (its default), "
        "or remove spec.snapshots"
    ]
