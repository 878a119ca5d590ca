"""What a dispatcher pod says about tf.data distributed snapshots, one typed model for every reader.

``tf.data.experimental.distributed_save`` asks a fault-tolerant dispatcher to have its workers
write a dataset to a directory; nothing in TensorFlow reports how far that got, except the files
it writes. The dispatcher's server program reads them (``server/snapshots.py``,
``server/snapshotfiles.py``) and answers, as JSON, at ``SNAPSHOTS_PATH`` on the dispatcher pod's
health port: every snapshot its journal names, or the paths asked for with ``?path=...``
(repeatable). The trainer's helper (``client.snapshots``) waits on it; the operator will read it
for a snapshot's status.

``DELETE SNAPSHOTS_PATH?path=P`` deletes a finished snapshot's data (``plan_deletion`` decides
what goes, ``SnapshotDeletion`` is the answer). A fault-tolerant dispatcher replays its journal
when it starts, and TensorFlow's ``SnapshotManager::Resume`` (``snapshot/snapshot_manager.cc``)
fails the start when a journaled snapshot's path is gone; for one with ``DONE`` or ``ERROR`` it
reads nothing else. So a journaled snapshot keeps a tombstone: its small files, ``ERROR`` in
place of ``DONE`` (``tombstone_error``: TensorFlow's ``Dataset.load`` of a tombstone with ``DONE``
reads zero elements without a word; with ``ERROR`` it raises), and ``DELETED``, ours.

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

from tfdata_operator.wire.serverconfig import JOURNAL_DIR_NAME, OWNER_MARKER_NAME
from tfdata_operator.wire.signals import json_object

# GET, optionally ?path=P&path=Q: one SnapshotsReport as JSON. DELETE ?path=P: one SnapshotDeletion.
SNAPSHOTS_PATH = "/v1/snapshots"
PATH_PARAMETER = "path"
# A request names at most this many paths, each at most this long.
MAX_PATHS = 64
MAX_PATH_LENGTH = 4096
# A snapshot's name, the last part of its path (``<snapshot directory>/<name>``): a TFDataSnapshot's
# spec.snapshotName (the CRD has the same pattern) and ``client.snapshots.NAME`` both fit it. No "/",
# and no leading ".": a name is one directory, never "." or "..".
SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
MAX_NAME_LENGTH = 253

# The states, from the files TensorFlow writes at the snapshot's path:
IN_PROGRESS = "IN_PROGRESS"  # snapshot.metadata, but neither DONE nor ERROR yet
COMPLETED = "COMPLETED"  # DONE: every stream finished; Dataset.load reads every element
FAILED = "FAILED"  # ERROR: a worker's error ended it; ``error`` holds TensorFlow's text
MISSING = "MISSING"  # nothing at the path
UNKNOWN = "UNKNOWN"  # the path could not be read, or holds no tf.data snapshot; ``detail`` says which
DELETED = "DELETED"  # DELETED (ours): its data was deleted, a tombstone is kept (the journal names it)
STATES = (IN_PROGRESS, COMPLETED, FAILED, MISSING, UNKNOWN, DELETED)
FINAL_STATES = (COMPLETED, FAILED, DELETED)

# The names TensorFlow gives the files under a snapshot's path (``snapshot/path_utils.cc``).
DONE_FILE = "DONE"
ERROR_FILE = "ERROR"
METADATA_FILE = "snapshot.metadata"
DATASET_DEF_FILE = "dataset_def.proto"
DATASET_SPEC_FILE = "dataset_spec.pb"
CHUNKS_DIR = "chunks"
STREAMS_DIR = "streams"
STREAM_PREFIX = "stream_"
PREFETCHED_SPLITS_DIR = "prefetched_splits"  # snapshot/snapshot_split_provider and the dispatcher's prefetch
# Ours, not TensorFlow's: the tombstone of a deleted snapshot, JSON {"state_before": ..., "deleted_at": ...}.
DELETED_FILE = "DELETED"
# Every name written directly at a snapshot's path: TensorFlow's (2.16 to 2.21; the rest of its layout
# is below streams/) and ours. An atomic write's temporary file is one of these, then
# ``__<unique>.tmp`` (``snapshot/file_utils.cc``). A DELETE refuses a path that holds anything else.
LAYOUT_NAMES = (
    METADATA_FILE,
    DATASET_DEF_FILE,
    DATASET_SPEC_FILE,
    DONE_FILE,
    ERROR_FILE,
    CHUNKS_DIR,
    STREAMS_DIR,
    PREFETCHED_SPLITS_DIR,
    DELETED_FILE,
)
TEMPORARY_SUFFIX = ".tmp"
# What a journaled snapshot's tombstone keeps: the files Resume reads (ERROR; it stops there) and the
# few small ones that say what the snapshot was. The rest of LAYOUT_NAMES (chunks/, streams/,
# prefetched_splits/, DONE once ERROR replaces it) and the temporary files is the data.
TOMBSTONE_FILES = (METADATA_FILE, DATASET_DEF_FILE, DATASET_SPEC_FILE, ERROR_FILE, DELETED_FILE)
# ERROR's text is kept to this many characters (a condition's message must stay readable).
MAX_ERROR_CHARACTERS = 4000


class SnapshotsError(ValueError):
    """A snapshots document that cannot be used; the message says what is wrong."""


class PathRefused(SnapshotsError):
    """A path outside the service's snapshot directory, which the dispatcher neither deletes nor
    checks for writing (403); the message says which directory it serves."""


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
    # Only for a MISSING path: whether the dispatcher could write a file where the snapshot would go
    # (its nearest directory that exists); ``detail`` says why not. None: not checked.
    writable: bool | None = None

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
            DELETED: "deleted",
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
    if values["writable"] is not None and not isinstance(values["writable"], bool):
        raise SnapshotsError(f"writable must be true, false or null, got {values['writable']!r}")
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


def confined(path: str, directory: str | None) -> str:
    """``path`` when it is ``<directory>/<name>``, one snapshot name directly in the service's
    snapshot directory (``DispatcherServerConfig.snapshot_dir``); raises PathRefused otherwise.

    Anyone who reaches the dispatcher's health port can ask: a path elsewhere (another service's
    snapshot, the journal, ``..``) is refused before anything is read or written. The path is
    compared as written, never resolved: a ``..`` or ``.`` part, an empty one or a trailing "/" is
    not a name, so it is refused.
    """
    if directory is None:
        raise PathRefused(
            "this dispatcher has no snapshot directory (its TFDataService has no spec.snapshots): it deletes no "
            f"snapshot and checks no path, and reads only the paths its journal names; refused {path[:200]!r}"
        )
    base = directory.rstrip("/")
    name = path[len(base) + 1 :] if path.startswith(base + "/") else ""
    if len(name) > MAX_NAME_LENGTH or not SNAPSHOT_NAME.fullmatch(name):
        raise PathRefused(
            f"{path[:200]!r} is not a snapshot of this service: the dispatcher serves only {base}/<name>, one name "
            f"directly in {directory} (letters, digits, '.', '_' or '-', not starting with '.' or '-', at most "
            f"{MAX_NAME_LENGTH})"
        )
    return path


def state_from_names(names: Iterable[str]) -> str:
    """A snapshot's state from the names directly under its path (a listing that succeeded)."""
    present = {name.rstrip("/") for name in names}
    if DELETED_FILE in present:
        return DELETED
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


# --- deleting a snapshot's data ------------------------------------------------------------------


@dataclass(frozen=True)
class DeletionPlan:
    """What a DELETE does at one path, from the names directly under it (``plan_deletion``).

    ``refused`` says why nothing is touched (409). Otherwise, in this order: ``write_marker``
    (``DELETED``), ``write_error`` (``ERROR`` from ``tombstone_error``), then ``remove``, names
    under the path (``DONE`` last); or, with ``remove_all``, the whole path.
    """

    state_before: str
    journaled: bool
    remove: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    remove_all: bool = False
    write_marker: bool = False
    write_error: bool = False
    refused: str | None = None


def plan_deletion(names: Iterable[str] | None, journaled: bool) -> DeletionPlan:
    """What deleting the snapshot whose path lists ``names`` does (None: nothing at the path).

    A snapshot still written is refused (TensorFlow cannot cancel one: its workers would go on
    writing), and so is a path that holds no snapshot (no ``snapshot.metadata``) or anything
    besides a snapshot's own files (``LAYOUT_NAMES``): this deletes snapshots, never a directory
    that merely looks like one (a dispatcher's work directory inside the snapshot directory, with
    ``snapshot.metadata`` and ``DONE`` planted beside its journal). A finished one (COMPLETED,
    FAILED, or DELETED: a DELETE again finishes one that was cut short) goes entirely when the
    journal does not name it, else down to its tombstone (``TOMBSTONE_FILES``).
    """
    if names is None:
        return DeletionPlan(MISSING, journaled)
    present = sorted({name.rstrip("/") for name in names})
    state = state_from_names(present)
    if METADATA_FILE not in present:
        why = f"no {METADATA_FILE} at the path: it holds no tf.data distributed snapshot"
        return DeletionPlan(UNKNOWN, journaled, refused=f"{why}, so nothing is deleted")
    if state == IN_PROGRESS:
        return DeletionPlan(
            state,
            journaled,
            refused="the snapshot is being written and TensorFlow cannot cancel one (its workers would go on "
            "writing): wait until it is COMPLETED or FAILED, then delete it",
        )
    if foreign := foreign_names(present):
        return DeletionPlan(state, journaled, refused=_foreign(foreign))
    if not journaled:
        return DeletionPlan(state, journaled, remove=tuple(present), remove_all=True)
    remove = [n for n in present if n not in TOMBSTONE_FILES and n != DONE_FILE]
    if DONE_FILE in present:
        remove.append(DONE_FILE)  # last: until ERROR replaces it, DONE keeps the dispatcher's Resume short
    keep = sorted({*(n for n in present if n in TOMBSTONE_FILES), ERROR_FILE, DELETED_FILE})
    return DeletionPlan(
        state,
        journaled,
        remove=tuple(remove),
        keep=tuple(keep),
        write_marker=DELETED_FILE not in present,
        write_error=ERROR_FILE not in present,
    )


def foreign_names(names: Iterable[str]) -> list[str]:
    """The names of ``names`` (directly at a snapshot's path) that no snapshot writes there."""
    return [name for name in names if name not in LAYOUT_NAMES and not _temporary(name)]


def _temporary(name: str) -> bool:
    written, underscores, unique = name.partition("__")
    return bool(underscores) and written in LAYOUT_NAMES and unique.endswith(TEMPORARY_SUFFIX)


def _foreign(names: list[str]) -> str:
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    text = (
        f"the path holds what no tf.data snapshot writes there: {shown}. A snapshot is deleted only when it "
        "holds nothing but its own files, so nothing is deleted"
    )
    if JOURNAL_DIR_NAME in names or OWNER_MARKER_NAME in names:
        text += (
            f" ({JOURNAL_DIR_NAME} and {OWNER_MARKER_NAME} are a dispatcher's journal and its owner marker: "
            "a dispatcher.workDir lies inside the snapshot directory; give it a directory of its own)"
        )
    return text + ". Move what is not the snapshot's elsewhere, or delete the path by hand"


def tombstone_error(path: str) -> bytes:
    """``ERROR`` for a deleted COMPLETED snapshot: a ``StatusProto`` in text format, which
    ``Resume`` reads and ``Dataset.load`` raises (``ValueError: Failed to load tf.data snapshot``)."""
    message = (
        f"the data of the tf.data snapshot at {path} was deleted (DELETE {SNAPSHOTS_PATH} on the dispatcher "
        "that wrote it; it kept these few files because its journal names the path): save it again under a new name"
    )
    escaped = message.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'code: NOT_FOUND\nmessage: "{escaped}"\n'.encode()


def deleted_marker(state_before: str, deleted_at: float) -> bytes:
    """``DELETED``'s content."""
    return json.dumps({"state_before": state_before, "deleted_at": deleted_at}, sort_keys=True).encode() + b"\n"


def marker_state_before(raw: bytes) -> str | None:
    """The state a deleted snapshot was in, from ``DELETED``; None when it does not say."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    state = data.get("state_before") if isinstance(data, dict) else None
    return state if state in FINAL_STATES else None


@dataclass(frozen=True)
class SnapshotDeletion:
    """The answer to ``DELETE SNAPSHOTS_PATH?path=P``.

    ``removed`` and ``kept`` are names directly under the path (when the journal does not name
    it, the path itself went too). ``detail`` says why the rest is kept, or why nothing was
    touched (409). ``under_way``: the files are not gone yet and nothing failed; asked again later,
    it answers 200 once they are. With 409, their removal runs in the background (started by this
    DELETE, or by an earlier one, and then this one started nothing); with 503, the dispatcher
    removes as many snapshots as it does at once, and nothing was started. Never with a 2xx: an
    operator older than this field takes every 2xx as "deleted".
    """

    path: str
    state_before: str
    journaled: bool
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    detail: str = ""
    under_way: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SnapshotDeletion:
        data = json_object(text, "a snapshot deletion", SnapshotsError)
        path, state, journaled = data.get("path"), data.get("state_before"), data.get("journaled")
        removed, kept, detail = data.get("removed", []), data.get("kept", []), data.get("detail", "")
        under_way = data.get("under_way", False)
        if not isinstance(path, str) or not path:
            raise SnapshotsError(f"path must be a non-empty string, got {path!r}")
        if state not in STATES:
            raise SnapshotsError(f"state_before must be one of {', '.join(STATES)}, got {state!r}")
        if not isinstance(journaled, bool):
            raise SnapshotsError(f"journaled must be true or false, got {journaled!r}")
        for name, value in (("removed", removed), ("kept", kept)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SnapshotsError(f"{name} must be a list of strings, got {value!r}")
        if not isinstance(detail, str):
            raise SnapshotsError(f"detail must be a string, got {detail!r}")
        if not isinstance(under_way, bool):
            raise SnapshotsError(f"under_way must be true or false, got {under_way!r}")
        return cls(path, state, journaled, tuple(removed), tuple(kept), detail, under_way)


def deletion_path(query: dict[str, list[str]]) -> str:
    """The one path a DELETE names (``parse_qs`` of its query); raises SnapshotsError otherwise."""
    paths = query_paths(query)
    if len(paths) != 1:
        raise SnapshotsError(f"a DELETE names exactly one {PATH_PARAMETER}=, got {len(paths)}")
    return paths[0]
