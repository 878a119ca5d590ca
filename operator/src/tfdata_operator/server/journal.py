"""A fault-tolerant dispatcher's journal, read as it grows, on any file system.

TensorFlow journals every change to the dispatcher's state before it answers, into
``<work_dir>/tf_data_dispatcher_journal/journal_<n>`` (a new file each time the dispatcher
starts): TFRecord-framed ``Update`` protos (tensorflow/core/data/service/journal.proto). The
wheel ships no classes for them, so the few fields read here are declared here (``update_class``):

- ``acquire_iteration_client = 6`` (``iteration_id = 1``, ``iteration_client_id = 2``) and
  ``release_iteration_client = 7`` (``iteration_client_id = 1``): the clients attached to jobs,
  and with ``create_job = 14`` (``job_id = 1``, ``job_name = 2``), ``create_iteration = 2``
  (``iteration_id = 1``, ``job_id = 2``) and ``garbage_collect_iteration = 12``
  (``iteration_id = 1``), which job each reads (``aggregate``);
- ``snapshot = 15`` (``path = 1``): a ``distributed_save`` the dispatcher accepted (``snapshots``).

A file only grows, so ``JournalTail`` reads only what was appended since its last call, and
leaves a record still being written for the next one; one exception: before a dispatcher starts,
``forget_finished_snapshots`` rewrites the files that name finished snapshots without those
records (why: its docstring), and a tail that finds a file shorter than it read reads them all
again (``rewound``). The supervisor reads its journal from the
local disk (``LocalFileSystem``); the TensorFlow process reads through ``tf.io.gfile``
(``tffiles.GFileSystem``), which also reaches ``gs://``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import struct
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tfdata_operator.wire import serverconfig

JOURNAL_DIR = serverconfig.JOURNAL_DIR_NAME
_JOURNAL_FILE = re.compile(r"journal_([0-9]+)")
_HEADER = 12  # uint64 length, uint32 masked CRC of it
_FOOTER = 4  # uint32 masked CRC of the record


class FileSystem(Protocol):
    """What is read of a file system. ``listdir`` and ``read`` raise FileNotFoundError for a missing
    path; names may end in "/" (directories on object stores)."""

    def listdir(self, path: str) -> list[str]: ...

    def size_and_mtime(self, path: str) -> tuple[int, float]: ...

    def read(self, path: str, offset: int = 0) -> bytes: ...


class WritableFileSystem(FileSystem, Protocol):
    """And what a snapshot's deletion writes. ``remove_tree`` removes a file or a directory with
    everything below it, and raises FileNotFoundError when nothing is there; ``symlinks`` lists
    the symbolic links at and below a path (a deletion refuses a tree that has any)."""

    def write(self, path: str, data: bytes) -> None: ...

    def remove_tree(self, path: str) -> None: ...

    def symlinks(self, path: str) -> list[str]: ...


class JournalFileSystem(FileSystem, Protocol):
    """What rewriting a journal takes (``forget_finished_snapshots``)."""

    def write(self, path: str, data: bytes) -> None: ...

    def replace(self, source: str, target: str) -> None:
        """Renames ``source`` to ``target``, replacing it."""
        ...


class LocalFileSystem:
    """``WritableFileSystem`` on this machine's files."""

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except NotADirectoryError as exc:
            raise FileNotFoundError(path) from exc

    def size_and_mtime(self, path: str) -> tuple[int, float]:
        info = os.stat(path)
        return info.st_size, info.st_mtime

    def read(self, path: str, offset: int = 0) -> bytes:
        with open(path, "rb") as file:
            file.seek(offset)
            return file.read()

    def write(self, path: str, data: bytes) -> None:
        with open(path, "wb") as file:
            file.write(data)

    def remove_tree(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)

    def symlinks(self, path: str) -> list[str]:
        if os.path.islink(path):
            return [path]
        return [join(d, n) for d, dirs, files in os.walk(path) for n in dirs + files if os.path.islink(join(d, n))]


def join(base: str, *parts: str) -> str:
    """Paths joined with "/", which every TensorFlow file system takes (``gs://b/x``)."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


@functools.cache
def update_class() -> Any:
    """TensorFlow's ``Update``, declared with only the fields read (see the module)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="tfdata_tf_journal.proto", package="tfdata_tf")
    int64, string = field.TYPE_INT64, field.TYPE_STRING
    messages: dict[str, tuple[tuple[str, int, int], ...]] = {
        # A job name is a trainer's text: read as bytes, so that no text of it can fail the parse.
        "CreateJobUpdate": (("job", 1, int64), ("name", 2, field.TYPE_BYTES)),
        "CreateIterationUpdate": (("iteration", 1, int64), ("job", 2, int64)),
        "AcquireIterationClientUpdate": (("iteration", 1, int64), ("client", 2, int64)),
        "ReleaseIterationClientUpdate": (("client", 1, int64),),
        "GarbageCollectIterationUpdate": (("iteration", 1, int64),),
        "SnapshotUpdate": (("path", 1, string),),
    }
    for message, declared in messages.items():
        added = file.message_type.add(name=message)
        for name, number, kind in declared:
            added.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    update = file.message_type.add(name="Update")
    for name, number, type_name in (
        ("create_job", 14, "CreateJobUpdate"),
        ("create_iteration", 2, "CreateIterationUpdate"),
        ("acquire", 6, "AcquireIterationClientUpdate"),
        ("release", 7, "ReleaseIterationClientUpdate"),
        ("garbage_collect", 12, "GarbageCollectIterationUpdate"),
        ("snapshot", 15, "SnapshotUpdate"),
    ):
        update.field.add(
            name=name,
            number=number,
            type=field.TYPE_MESSAGE,
            label=field.LABEL_OPTIONAL,
            type_name=f".tfdata_tf.{type_name}",
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tfdata_tf.Update"))


def _records(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each whole TFRecord in ``data``; a record still being written is left out
    (TensorFlow syncs whole records: only the last can be cut)."""
    position = 0
    while len(data) - position >= _HEADER:
        (length,) = struct.unpack_from("<Q", data, position)
        end = position + _HEADER + length + _FOOTER
        if end > len(data):
            return
        yield position, end
        position = end


def _parse(data: bytes, start: int, end: int) -> Any:
    message = update_class()()
    message.ParseFromString(data[start + _HEADER : end - _FOOTER])
    return message


def _journal_files(fs: FileSystem, directory: str) -> list[str]:
    """The journal's file names in the order TensorFlow replays them; [] when there is none."""
    try:
        names = [n.rstrip("/") for n in fs.listdir(directory)]
    except FileNotFoundError:
        return []
    numbered = sorted((int(m.group(1)), n) for n in names if (m := _JOURNAL_FILE.fullmatch(n)))
    return [n for _, n in numbered]


class JournalTail:
    """The updates journaled in ``directory`` since the last call (not thread-safe: callers lock)."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self.fs = fs
        self.directory = directory
        self._offsets: dict[str, int] = {}
        # Set by a read that found a file rewritten (shorter than read): it returned every update
        # again, from the first, and the caller starts over from them.
        self.rewound = False

    def read(self) -> list[Any]:
        """The new updates, in order; [] while nothing is journaled. Raises OSError (or the file
        system's own error) when the journal cannot be read."""
        names = _journal_files(self.fs, self.directory)
        self.rewound = any(
            self._offsets.get(name, 0) > self.fs.size_and_mtime(join(self.directory, name))[0]
            for name in names
            if self._offsets.get(name)
        )
        if self.rewound:
            self._offsets.clear()
        updates = []
        for name in names:
            offset = self._offsets.get(name, 0)
            data = self.fs.read(join(self.directory, name), offset)
            position = 0
            for start, end in _records(data):
                updates.append(_parse(data, start, end))
                position = end
            self._offsets[name] = offset + position
        return updates


# A file being rewritten: not a name TensorFlow reads (it opens journal_<n> for n = 0, 1, ...).
REWRITING_SUFFIX = ".rewriting"


def forget_finished_snapshots(
    fs: JournalFileSystem, directory: str, finished: Callable[[str], str | None]
) -> list[tuple[str, str]]:
    """Drops from the journal in ``directory`` the records of snapshots ``finished`` says are over
    (it returns why, or None to keep one); returns the (path, why) of each dropped.

    To be called before the dispatcher replays the journal. TensorFlow replays every snapshot its
    journal names: one whose path is gone fails the dispatcher's start ("the snapshot path doesn't
    exist"), and a finished one (DONE or ERROR) is put back among the snapshots the workers are
    handed, counted as holding no stream, and never taken out again (``AddSnapshot`` in
    ``RestoreSnapshots``; only a stream's completion removes one). Each worker heartbeat is handed
    its current snapshots plus the least-assigned other one, ties in hash order
    (``SnapshotAssignmentManager::LoadBalanceSnapshots``): a finished snapshot that sorts first
    is handed out on every heartbeat, answers with nothing to write, and a snapshot saved after the
    restart never gets a stream. Nothing else in the journal refers to a snapshot's record, so
    dropping it changes nothing else TensorFlow restores.

    Each file is rewritten whole, its other records byte for byte, through a temporary name, then
    renamed over the old one; a record still being written (none, before the start) is kept.
    """
    names = _journal_files(fs, directory)
    verdicts: dict[str, str | None] = {}
    dropped: list[tuple[str, str]] = []
    for name in names:
        path = join(directory, name)
        data = fs.read(path)
        kept, drop_here = [], []
        position = 0
        for start, end in _records(data):
            update = _parse(data, start, end)
            snapshot = update.snapshot.path if update.HasField("snapshot") else None
            if snapshot is not None and snapshot not in verdicts:
                verdicts[snapshot] = finished(snapshot)
            why = verdicts.get(snapshot) if snapshot is not None else None
            if why is None:
                kept.append(data[start:end])
            else:
                drop_here.append((snapshot, why))
            position = end
        if not drop_here:
            continue
        temporary = path + REWRITING_SUFFIX
        fs.write(temporary, b"".join(kept) + data[position:])
        fs.replace(temporary, path)
        dropped += [(p, why) for p, why in drop_here if p is not None]
    return dropped
