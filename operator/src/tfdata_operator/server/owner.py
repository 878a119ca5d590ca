"""Who journals in a user's ``spec.dispatcher.workDir``: the owner marker.

A workDir the user chose (a ``gs://`` path, a shared volume) may be given to two services. They
would share one journal (DYNAMIC), or one would delete the other's static journals
(``tffiles.prune_old_journals``). So before a dispatcher touches its journal it claims the
workDir: ``serverconfig.OWNER_MARKER_NAME`` there names the service (``<namespace>/<name>``), and
a dispatcher whose marker names another service does not start.

Two dispatchers that claim a new workDir at the same moment both find no marker and both write
one; the last write stands. So a dispatcher that wrote the marker reads it back only after
``SETTLE_SECONDS``: by then the other's write (which follows its own read of "no marker" by
moments, not seconds) has landed, and exactly one of them finds its own name. The store has no
create-if-absent that works for every file system TensorFlow writes to (``gs://`` among them).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import Protocol

# What the marker may say that is quoted back; a service identity is at most 317 characters.
_QUOTED = 320
# How long a dispatcher that wrote the marker waits before it reads it back (once per new workDir).
SETTLE_SECONDS = 2.0


class MarkerStore(Protocol):
    """What is read and written of the marker (``tffiles.GFileSystem``, ``journal.LocalFileSystem``);
    ``read`` raises FileNotFoundError when there is no marker."""

    def read(self, path: str, offset: int = 0) -> bytes: ...

    def write(self, path: str, data: bytes) -> None: ...


class Verdict(enum.Enum):
    CLAIM = "claim"  # no marker (or an empty one): write ours
    OURS = "ours"
    FOREIGN = "foreign"


def decide(marker: str | None, owner: str) -> Verdict:
    """What the marker's text (None: there is no marker) means to the service ``owner``."""
    said = (marker or "").strip()
    if not said:
        return Verdict.CLAIM
    return Verdict.OURS if said == owner else Verdict.FOREIGN


def refusal(marker_path: str, other: str, owner: str) -> str:
    """What a dispatcher that does not start says: who owns the workDir, and what to do."""
    other = " ".join(other.split())[:_QUOTED]
    work_dir = marker_path.rsplit("/", 1)[0]
    return (
        f"the work directory {work_dir} belongs to TFDataService {other} ({marker_path} names it): "
        f"the dispatcher of {owner} does not start there, so as not to replay or delete that service's "
        "journals. Give each service its own spec.dispatcher.workDir."
    )


def claim(
    fs: MarkerStore,
    marker_path: str,
    owner: str,
    log: logging.Logger,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Claims the workDir for ``owner``; returns why the dispatcher must not start, or None.

    A marker that cannot be read or written (the store failing) is logged and the dispatcher
    starts: a flaky store does not keep a service down.
    """

    def read() -> str | None:
        try:
            return fs.read(marker_path).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None

    wrote = False
    try:
        marker = read()
        if decide(marker, owner) is Verdict.CLAIM:
            fs.write(marker_path, f"{owner}\n".encode())
            wrote = True
            sleep(SETTLE_SECONDS)  # another service may be claiming it at the same moment: its write lands
            marker = read()
    except Exception as exc:  # the file system's own errors: tf.errors.OpError and friends
        log.warning("could not check the owner marker %s (%s); starting anyway", marker_path, exc)
        return None
    verdict = decide(marker, owner)
    if verdict is Verdict.FOREIGN:
        return refusal(marker_path, marker or "", owner)
    if verdict is Verdict.CLAIM:
        log.warning("wrote the owner marker %s, but it reads back empty; starting anyway", marker_path)
    elif wrote:
        log.info("claimed the work directory for %s: %s names it", owner, marker_path)
    return None
