"""Directories compared as places: a local path or a URL, normalised (``spec.snapshots.directory``,
``spec.dispatcher.workDir``)."""

from __future__ import annotations

import functools
import posixpath


@functools.lru_cache(maxsize=4096)  # every reconcile of a service with snapshots compares it with all the others
def place(directory: str) -> tuple[str, tuple[str, ...]]:
    """A directory as compared: its scheme ("" for a local path; ``file://`` is local) and its segments,
    without empty ones, ``.``, or a ``..`` with what it cancels (``gs://b/a/`` is ``gs://b/a``)."""
    scheme, sep, rest = directory.partition("://")
    if not sep or scheme.lower() == "file":
        scheme, rest = "", directory if not sep else rest
    normal = posixpath.normpath("/" + rest)
    return scheme.lower(), tuple(s for s in normal.split("/") if s)


def relation(mine: str, other: str) -> str | None:
    """How directory ``mine`` lies to ``other``: "the same as", "inside", "contains", or None (apart)."""
    a, b = place(mine), place(other)
    if a[0] != b[0]:
        return None
    if a[1] == b[1]:
        return "the same as"
    if a[1][: len(b[1])] == b[1]:
        return "inside"
    if b[1][: len(a[1])] == a[1]:
        return "contains"
    return None
