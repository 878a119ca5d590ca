"""One tf.data distributed snapshot's files, for the dispatcher's ``/v1/snapshots`` (``snapshots``):
how far the snapshot got, whether the snapshot directory can be written, and its data deleted as
``wire.snapshots.plan_deletion`` says.

What the workers write (``wire.snapshots`` has the layout) is read through a ``journal.FileSystem``:
``tf.io.gfile`` in the TensorFlow process, or, for a snapshot on this machine's disk,
``nofollow.NoFollowFileSystem``, which never follows a symbolic link at or below its path (a reading
that meets one says UNKNOWN). A chunk's size is read once (committed chunks never change).
``Journal`` is the snapshot paths the dispatcher's journal names (``journal``:
``Update.snapshot.path``).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field, replace

from tfdata_operator.server.journal import JOURNAL_DIR, FileSystem, JournalTail, WritableFileSystem, join
from tfdata_operator.server.nofollow import SymlinkError
from tfdata_operator.wire import snapshots
from tfdata_operator.wire.snapshots import DeletionPlan, SnapshotDeletion, SnapshotProgress


class Journal:
    """The snapshot paths a dispatcher's journal names, in the order journaled, each once."""

    def __init__(self, fs: FileSystem, work_dir: str | None) -> None:
        self._tail = JournalTail(fs, join(work_dir, JOURNAL_DIR)) if work_dir else None
        self._paths: dict[str, None] = {}

    def describe(self) -> str:
        if self._tail is None:
            return "no work_dir: this dispatcher is not fault tolerant, and distributed_save needs one that is"
        return f"snapshots named in the journal at {self._tail.directory}"

    def paths(self) -> list[str]:
        """Raises OSError (or the file system's own error) when the journal cannot be read."""
        if self._tail is not None:
            updates = self._tail.read()
            if self._tail.rewound:  # every update again, from the first
                self._paths.clear()
            for update in updates:
                if update.HasField("snapshot"):
                    self._paths[update.snapshot.path] = None
        return list(self._paths)


# --- one snapshot's files -----------------------------------------------------------------------


@dataclass
class Reading:
    """What is known of one path: the last progress and what never changes once read."""

    progress: SnapshotProgress
    read_at: float
    chunk_bytes: dict[str, int] = field(default_factory=dict)
    streams_done: set[str] = field(default_factory=set)
    started_at: float | None = None


def error_detail(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _unreadable(exc: BaseException) -> str:
    if isinstance(exc, SymlinkError):  # says where the link is, never what it points to
        return f"a symbolic link was found: {exc}, so the snapshot is not read"
    return f"cannot read: {error_detail(exc)}"


def read_progress(fs: FileSystem, path: str, journaled: bool, known: Reading | None = None) -> Reading:
    """Reads one snapshot's files; ``known`` (an earlier reading) saves what cannot have changed."""
    reading = Reading(SnapshotProgress(path, snapshots.UNKNOWN), 0.0)
    if known is not None:
        reading.chunk_bytes, reading.streams_done, reading.started_at = (
            known.chunk_bytes,
            known.streams_done,
            known.started_at,
        )
    try:
        names = [n.rstrip("/") for n in fs.listdir(path)]
    except FileNotFoundError:
        reading.progress = SnapshotProgress(path, snapshots.MISSING, journaled)
        return reading
    except Exception as exc:  # the file system's own errors (permissions, a remote store failing, a link)
        reading.progress = SnapshotProgress(path, snapshots.UNKNOWN, journaled, detail=_unreadable(exc))
        return reading
    state = snapshots.state_from_names(names)
    if state == snapshots.UNKNOWN:
        detail = f"no {snapshots.METADATA_FILE}: not a tf.data distributed snapshot, or one still being started"
        reading.progress = SnapshotProgress(path, state, journaled, detail=detail)
        return reading
    try:
        reading.progress = _read_started(fs, path, state, journaled, reading)
    except Exception as exc:
        reading.progress = SnapshotProgress(path, snapshots.UNKNOWN, journaled, detail=_unreadable(exc))
    return reading


def _read_started(fs: FileSystem, path: str, state: str, journaled: bool, reading: Reading) -> SnapshotProgress:
    # The root was listed first: once DONE was there, every chunk below is committed.
    try:
        chunk_names = [n.rstrip("/") for n in fs.listdir(join(path, snapshots.CHUNKS_DIR))]
    except FileNotFoundError:
        chunk_names = []
    elements = chunks = 0
    for name in chunk_names:
        count = snapshots.chunk_elements(name)
        if count is None:
            continue
        chunks += 1
        elements += count
        if name not in reading.chunk_bytes:
            reading.chunk_bytes[name] = fs.size_and_mtime(join(path, snapshots.CHUNKS_DIR, name))[0]
    try:
        streams = [
            n.rstrip("/")
            for n in fs.listdir(join(path, snapshots.STREAMS_DIR))
            if n.startswith(snapshots.STREAM_PREFIX)
        ]
    except FileNotFoundError:
        streams = []
    for stream in streams:
        if stream in reading.streams_done:
            continue
        stream_names = {n.rstrip("/") for n in fs.listdir(join(path, snapshots.STREAMS_DIR, stream))}
        if snapshots.DONE_FILE in stream_names:
            reading.streams_done.add(stream)
    if reading.started_at is None:
        reading.started_at = fs.size_and_mtime(join(path, snapshots.METADATA_FILE))[1]
    error = finished_at = detail = None
    if state == snapshots.DELETED:
        before = snapshots.marker_state_before(fs.read(join(path, snapshots.DELETED_FILE)))
        finished_at = fs.size_and_mtime(join(path, snapshots.DELETED_FILE))[1]
        detail = f"its data was deleted (it was {before or 'finished'}); a tombstone is kept" + (
            ": this dispatcher's journal names the path" if journaled else ""
        )
    elif state == snapshots.FAILED:
        error = snapshots.error_text(fs.read(join(path, snapshots.ERROR_FILE)))
        finished_at = fs.size_and_mtime(join(path, snapshots.ERROR_FILE))[1]
    elif state == snapshots.COMPLETED:
        finished_at = fs.size_and_mtime(join(path, snapshots.DONE_FILE))[1]
    return SnapshotProgress(
        path,
        state,
        journaled,
        streams_total=len(streams),
        streams_done=len(reading.streams_done & set(streams)),
        chunks=chunks,
        elements=elements,
        bytes=sum(reading.chunk_bytes[n] for n in chunk_names if n in reading.chunk_bytes),
        error=error,
        detail=detail,
        started_at=reading.started_at,
        finished_at=finished_at,
    )


# A snapshot directory that does not exist yet is checked in the nearest one above it that does,
# at most this many levels up (distributed_save creates the rest).
MAX_WRITE_CHECK_LEVELS = 8
WRITE_CHECK_PREFIX = ".tfdata-write-check-"


def write_check(fs: WritableFileSystem, snapshot_dir: str) -> str | None:
    """Why a snapshot could not be written in ``snapshot_dir`` (None: it can): a file written and
    removed there, or in the nearest directory above it that exists, as this server's user. The
    workers write with the same user, on the same storage (``spec.snapshots.volume`` is mounted in
    all of them, and a URL is the same store)."""
    directory = snapshot_dir.rstrip("/") or "/"
    for _ in range(MAX_WRITE_CHECK_LEVELS):
        try:
            fs.listdir(directory)
            break
        except FileNotFoundError:
            parent = directory.rsplit("/", 1)[0]
            if not parent or parent.endswith(":/") or parent == directory:
                break
            directory = parent
        except Exception as exc:
            return f"cannot list {directory}: {error_detail(exc)}"
    probe = join(directory, f"{WRITE_CHECK_PREFIX}{uuid.uuid4().hex}")
    try:
        fs.write(probe, b"")
    except Exception as exc:
        return f"cannot write in {directory}: {error_detail(exc)}"
    with contextlib.suppress(Exception):
        fs.remove_tree(probe)
    return None


# --- a snapshot's deletion, as planned ---------------------------------------------------------


def through_link(link: str) -> str:
    return f"{link} is a symbolic link: a snapshot is never deleted through one, so nothing was deleted"


def mark(fs: WritableFileSystem, path: str, plan: DeletionPlan, now: float) -> DeletionPlan:
    """Writes the tombstone's markers ``plan`` says (``DELETED``, then ``ERROR``): the plan left."""
    if plan.write_marker:
        fs.write(join(path, snapshots.DELETED_FILE), snapshots.deleted_marker(plan.state_before, now))
    if plan.write_error:
        fs.write(join(path, snapshots.ERROR_FILE), snapshots.tombstone_error(path))
    return replace(plan, write_marker=False, write_error=False)


def carry_out(fs: WritableFileSystem, path: str, plan: DeletionPlan, now: float) -> SnapshotDeletion:
    """Does what ``plan`` says, in its order; raises the file system's error where it stops."""
    if plan.remove_all:
        with contextlib.suppress(FileNotFoundError):  # another DELETE got there first
            fs.remove_tree(path)
        return SnapshotDeletion(
            path,
            plan.state_before,
            False,
            removed=plan.remove,
            detail="this dispatcher's journal does not name the path: it was removed entirely",
        )
    mark(fs, path, plan, now)
    for name in plan.remove:
        with contextlib.suppress(FileNotFoundError):  # another DELETE got there first
            fs.remove_tree(join(path, name))
    return SnapshotDeletion(
        path,
        plan.state_before,
        True,
        removed=plan.remove,
        kept=plan.keep,
        detail=(
            "this dispatcher's journal names the path, and TensorFlow fails the dispatcher's start when a journaled "
            f"snapshot's path is gone: these files are kept, with {snapshots.ERROR_FILE} saying it was deleted"
        ),
    )
