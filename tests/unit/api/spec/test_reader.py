"""spec/reader.py: how a section reads a string field against a pattern and what its refusal says, and a
field set to null."""

from __future__ import annotations

import re

from tfdata_operator.api.spec.reader import Reader

from fixtures.cases import parse


def test_a_pattern_without_a_name_is_shown_as_the_expression_to_match() -> None:
    """A section that brings a pattern of its own, not in PATTERN_NAMES, still says what the value must be."""
    problems: list[str] = []
    r = Reader({"mode": "Fast"}, "spec.section", problems)
    assert r.string("mode", "slow", pattern=re.compile(r"^[a-z]+$")) == "slow"
    assert problems == ["spec.section.mode has an invalid value 'Fast': it must match ^[a-z]+$"]


def test_a_field_set_to_null_is_unset_and_known() -> None:
    """The API server drops a null it does not keep; a file given to `tfdata-operator render` keeps it, and
    a section checked with has() then reads as unset, not as an unknown field."""
    problems: list[str] = []
    r = Reader({"egress": None, "stray": None}, "spec.networkPolicy", problems)
    assert not r.has("egress")
    r.finish()
    assert problems == ["spec.networkPolicy has unknown fields: stray"]


def test_sections_set_to_null_are_read_as_absent() -> None:
    svc = parse(snapshots=None, autoscaling=None, networkPolicy={"egress": None}, lifecycle={"idle": None})
    assert (svc.snapshots, svc.autoscaling, svc.network_policy.egress, svc.lifecycle.idle) == (None, None, None, None)
