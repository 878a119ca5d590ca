"""spec.dispatcher (api/spec/dispatcher.py): a refused workDir is no journal, so one refusal names both problems."""

from __future__ import annotations

import pytest

from tfdata_operator.api import spec

from fixtures.cases import parse


def test_a_refused_work_dir_without_storage_is_also_named_as_no_place_to_journal() -> None:
    with pytest.raises(spec.SpecError) as err:
        parse(dispatcher={"workDir": "journal", "storage": {"enabled": False}})
    assert err.value.problems == [
        "spec.dispatcher.workDir must be an absolute path or a file or gs URL (the filesystems TensorFlow 2.21 "
        "has), got 'journal'",
        "spec.dispatcher.faultTolerantMode (true by default) needs somewhere to journal, and "
        "spec.dispatcher.storage.enabled is false with no spec.dispatcher.workDir: set storage.enabled to true "
        "(its default), set a workDir, or set faultTolerantMode to false",
    ]
