"""What a write would change: one comparison of an object with what is stored, under each write's rules.

The operator writes children with a server-side apply, its status with a merge patch, and
compares before writing so that a reconcile with nothing to do sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def changes(old: Any, new: Any, *, apply: bool = False, removes: bool = False) -> bool:
    """Whether writing ``new`` over ``old`` changes anything (None means absent).

    Maps compare on ``new``'s keys: a key ``new`` leaves out stays as it is, as in a merge patch
    and a server-side apply; with ``removes``, a key only ``old`` has counts too (``new``
    replaces the whole map). Lists compare whole, as a merge patch replaces them; with
    ``apply``, item by item under the same rules, as a server-side apply merges each item over
    what the server added to it (a container's defaults, say).
    """

    def differs(o: Any, n: Any) -> bool:  # the rules hold at every depth
        return changes(o, n, apply=apply, removes=removes)

    if isinstance(new, Mapping):
        if not isinstance(old, Mapping):
            return True
        if any(differs(old.get(k), v) for k, v in new.items()):
            return True
        return removes and any(k not in new and v is not None for k, v in old.items())
    if apply and isinstance(new, list):
        if not isinstance(old, list) or len(old) != len(new):
            return True
        return any(map(differs, old, new))  # pairs every item: the lengths are equal
    return bool(old != new)
