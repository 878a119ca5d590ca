"""What a dispatcher pod says about tf.data distributed snapshots, one typed model for every reader.

``tf.data.experimental.distributed_save`` asks a fault-tolerant dispatcher to have its workers
write a dataset to a directory; nothing in TensorFlow reports how far that got, except the files
it writes. The dispatcher's server program reads them (``server/snapshots.py``) and answers, as
JSON, at ``SNAPSHOTS_PATH`` on the dispatcher pod's health port: every snapshot its journal
names, or the paths asked for with ``?path=...`` (repeatable). The trainer's helper
(``client.snapshots``) waits on it; the operator will read it for a snapshot's status.

Like ``signals``, this module imports neither TensorFlow nor the Kubernetes client.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from tfdata_operator.wire.signals import json_object

# GET, optionally ?path=P&path=Q: one SnapshotsReport as JSON.
SNAPSHOTS_PATH = "/v1/snapshots"
PATH_PARAMETER = "path"
# A request names at most this many paths, each at most this long.
MAX_PATHS = 64
MAX_PATH_LENGTH = 4096

# The states, from the files TensorFlow writes at the snapshot's path:
IN_PROGRESS = "IN_PROGRESS"  # snapshot.metadata, but neither DONE nor ERROR yet
COMPLETED = "COMPLETED"  # DONE: every stream finished; Dataset.load reads every element
FAILED = "FAILED"  # ERROR: a worker's error ended it; ``error`` holds TensorFlow's text
MISSING = "MISSING"  # nothing at the path
UNKNOWN = "UNKNOWN"  # the path could not be read, or holds no tf.data snapshot; ``detail`` says which
STATES = (IN_PROGRESS, COMPLETED, FAILED, MISSING, UNKNOWN)
FINAL_STATES = (COMPLETED, FAILED)

# The names TensorFlow gives the files under a snapshot's path (``snapshot/path_utils.cc``).
DONE_FILE = "DONE"
ERROR_FILE = "ERROR"
METADATA_FILE = "snapshot.metadata"
CHUNKS_DIR = "chunks"
STREAMS_DIR = "streams"
STREAM_PREFIX = "stream_"
# ERROR's text is kept to this many characters (a condition's message must stay readable).
MAX_ERROR_CHARACTERS = 4000


class SnapshotsError(ValueError):
    """A snapshots document that cannot be used; the message says what is wrong."""


@dataclass(frozen=True)
class SnapshotProgress:
    """One snapshot, as its files showed it ``age_seconds`` ago.

    ``streams_total`` counts the streams the dispatcher created (one per worker that took part,
    ``streams/stream_<i>``), ``streams_done`` those a worker finished. ``chunks``, ``elements``
    and ``bytes`` count committed data only (``chunks/chunk_<stream>_<index>_<elements>``).
    A worker commits a chunk when it is full (TensorFlow's default:
    6 GB) or at a checkpoint (every 30 minutes by default), so these move in steps. ``journaled``
    says whether this dispatcher's journal names the path (it started or resumed the snapshot).
    Times are Unix seconds from the files' modification times: ``started_at`` from
    ``snapshot.metadata``, ``finished_at`` from ``DONE`` or ``ERROR``.
    """

    path: str
    state: str
    journaled: bool = False
    streams_total: int = 0
    streams_done: int = 0
    chunks: int = 0
    elements: int = 0
    bytes: int = 0
    error: str | None = None
    detail: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    age_seconds: float = 0.0

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def describe(self) -> str:
        """One line for a person."""
        what = {
            COMPLETED: "completed",
            FAILED: "failed",
            IN_PROGRESS: "in progress",
            MISSING: "missing",
            UNKNOWN: "unknown",
        }[self.state]
        text = f"snapshot {self.path} {what}"
        if self.state in (IN_PROGRESS, COMPLETED, FAILED):
            text += (
                f": {self.streams_done}/{self.streams_total} streams done, {self.elements} elements "
                f"in {self.chunks} chunks ({self.bytes} bytes) committed"
            )
        if self.error:
            text += f"; error: {self.error}"
        if self.detail:
            text += f" ({self.detail})"
        return text


@dataclass(frozen=True)
class SnapshotsReport:
    """The answer at ``SNAPSHOTS_PATH``.

    ``snapshots`` is every path asked for, in the order asked, or, without ``?path=``, every
    path the journal names, in the order journaled. ``journal`` says where the paths came from,
    or why there are none (a dispatcher that is not fault tolerant cannot snapshot).
    """

    snapshots: tuple[SnapshotProgress, ...]
    journal: str

    def get(self, path: str) -> SnapshotProgress | None:
        return next((s for s in self.snapshots if s.path == path), None)

    def to_json(self) -> str:
        return json.dumps({"snapshots": [asdict(s) for s in self.snapshots], "journal": self.journal}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SnapshotsReport:
        data = json_object(text, "a snapshots report", SnapshotsError)
        items, journal = data.get("snapshots"), data.get("journal")
        if not isinstance(items, list):
            raise SnapshotsError(f"snapshots must be a list, got {items!r}")
        if not isinstance(journal, str):
            raise SnapshotsError(f"journal must be a string, got {journal!r}")
        return cls(tuple(progress_from_dict(item) for item in items), journal)


_COUNTS = ("streams_total", "streams_done", "chunks", "elements", "bytes")
_TEXTS = ("error", "detail")
_TIMES = ("started_at", "finished_at")


def progress_from_dict(data: Any) -> SnapshotProgress:
    """One snapshot's entry, checked; fields a newer dispatcher adds are ignored."""
    if not isinstance(data, dict):
        raise SnapshotsError(f"a snapshot entry must be a JSON object, got {data!r}")
    required = {f.name for f in fields(SnapshotProgress) if f.default is dataclasses.MISSING}
    if missing := sorted(required - set(data)):
        raise SnapshotsError(f"missing fields in a snapshot entry: {', '.join(missing)}")
    values = {f.name: data.get(f.name, f.default) for f in fields(SnapshotProgress)}
    if not isinstance(values["path"], str) or not values["path"]:
        raise SnapshotsError(f"path must be a non-empty string, got {values['path']!r}")
    if values["state"] not in STATES:
        raise SnapshotsError(f"state must be one of {', '.join(STATES)}, got {values['state']!r}")
    if not isinstance(values["journaled"], bool):
        raise SnapshotsError(f"journaled must be true or false, got {values['journaled']!r}")
    for name in _COUNTS:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SnapshotsError(f"{name} must be an integer of at least 0, got {value!r}")
    if values["streams_done"] > values["streams_total"]:
        raise SnapshotsError(
            f"streams_done ({values['streams_done']}) exceeds streams_total ({values['streams_total']})"
        )
    for name in _TEXTS:
        if values[name] is not None and not isinstance(values[name], str):
            raise SnapshotsError(f"{name} must be a string or null, got {values[name]!r}")
    for name in (*_TIMES, "age_seconds"):
        value = values[name]
        if value is None and name in _TIMES:
            continue
        if not _number(value) or value < 0:
            raise SnapshotsError(f"{name} must be a number of at least 0, got {value!r}")
    return SnapshotProgress(**values)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def chunk_elements(name: str) -> int | None:
    """The element count a committed chunk's file name carries, ``chunk_<stream>_<index>_<elements>``;
    None for any other name (TensorFlow's ``path_utils.cc`` ``ParseChunkFilename``)."""
    parts = name.split("_")
    if len(parts) != 4 or parts[0] != "chunk" or not all(p.isdigit() and p.isascii() for p in parts[1:]):
        return None
    return int(parts[3])


def query_paths(query: dict[str, list[str]]) -> tuple[str, ...]:
    """The paths a request names (``parse_qs`` of its query); raises SnapshotsError for a bad request."""
    if unknown := sorted(set(query) - {PATH_PARAMETER}):
        raise SnapshotsError(f"unknown query parameters: {', '.join(unknown)} (only {PATH_PARAMETER}= is known)")
    paths = tuple(dict.fromkeys(query.get(PATH_PARAMETER, [])))
    if len(paths) > MAX_PATHS:
        raise SnapshotsError(f"at most {MAX_PATHS} paths a request, got {len(paths)}")
    for path in paths:
        if not path or len(path) > MAX_PATH_LENGTH or "\x00" in path:
            raise SnapshotsError(f"a path must be 1 to {MAX_PATH_LENGTH} characters without NUL, got {path[:80]!r}")
    return paths


def state_from_names(names: Iterable[str]) -> str:
    """A snapshot's state from the names directly under its path (a listing that succeeded)."""
    present = {name.rstrip("/") for name in names}
    if ERROR_FILE in present:
        return FAILED
    if DONE_FILE in present:
        return COMPLETED
    if METADATA_FILE in present:
        return IN_PROGRESS
    return UNKNOWN


_STATUS_FIELD = re.compile(r"^\s*(code|message)\s*:\s*(.*?)\s*$")


def error_text(raw: bytes) -> str:
    """ERROR's content as a person reads it: ``CODE: message``.

    TensorFlow writes a ``StatusProto`` in protobuf text format (``code: INVALID_ARGUMENT``,
    ``message: "..."`` with C escapes); anything else is returned as it is, shortened.
    """
    text = raw.decode("utf-8", "replace")
    code = message = None
    for line in text.splitlines():
        match = _STATUS_FIELD.match(line)
        if match is None:
            continue
        name, value = match.groups()
        if name == "code":
            code = value
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            escaped = value[1:-1].encode("latin-1", "backslashreplace")
            message = codecs.escape_decode(escaped)[0].decode("utf-8", "replace")  # type: ignore[attr-defined]
    result = f"{code}: {message}" if code and message is not None else (message or text.strip())
    if len(result) > MAX_ERROR_CHARACTERS:
        result = result[: MAX_ERROR_CHARACTERS - 1] + "…"
    return result
