"""The one comparison behind every "would this write change anything": its rules, write by write."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.api.diff import changes

CONTAINER = {"name": "worker", "image": "img"}
PORT = {"name": "grpc", "containerPort": 5051}
SERVING = {**CONTAINER, "ports": [PORT]}
# What the API server gives back: the same container with the defaults it filled in.
DEFAULTED = {**CONTAINER, "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"}


@pytest.mark.parametrize(
    ("old", "new", "merge", "apply", "replace"),
    [
        # A key the write leaves out stays as it is; None is the same as absent.
        ({"a": 1, "b": 2}, {"a": 1}, False, False, True),
        ({"a": 1}, {"a": 1, "b": None}, False, False, False),
        ({"a": 1, "b": 2}, {"a": 1, "b": None}, True, True, True),
        ({"a": {"x": 1, "y": None}}, {"a": {"x": 1}}, False, False, False),
        ({"a": {"x": 1}}, {"a": {"x": 2}}, True, True, True),
        (None, {"a": 1}, True, True, True),
        ({"a": 1}, {}, False, False, True),
        ("text", {"a": 1}, True, True, True),
        # Replacing a whole block replaces the maps in it too: a key gone from one counts at any depth.
        ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, False, False, True),
        # Lists: a merge patch replaces them whole; an apply merges each item over the server's defaults.
        ({"c": [DEFAULTED]}, {"c": [CONTAINER]}, True, False, True),
        ({"c": [CONTAINER]}, {"c": [CONTAINER]}, False, False, False),
        ({"c": [CONTAINER, CONTAINER]}, {"c": [CONTAINER]}, True, True, True),
        ({"c": None}, {"c": [CONTAINER]}, True, True, True),
        ({"c": [{**DEFAULTED, "image": "old"}]}, {"c": [CONTAINER]}, True, True, True),
        # ... and so on down: a container's ports get the server's defaults too.
        ({"c": [{**DEFAULTED, "ports": [{**PORT, "protocol": "TCP"}]}]}, {"c": [SERVING]}, True, False, True),
    ],
)
def test_each_write_compares_by_its_own_rules(old: Any, new: Any, merge: bool, apply: bool, replace: bool) -> None:
    assert changes(old, new) is merge, "merge patch"
    assert changes(old, new, apply=True) is apply, "server-side apply"
    assert changes(old, new, removes=True) is replace, "a whole block replaced"
