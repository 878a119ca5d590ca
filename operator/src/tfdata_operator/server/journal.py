"""A fault-tolerant dispatcher's journal, read as it grows, on any file system.

TensorFlow journals every change to the dispatcher's state before it answers, into
``<work_dir>/tf_data_dispatcher_journal/journal_<n>`` (a new file each time the dispatcher
starts): TFRecord-framed ``Update`` protos (tensorflow/core/data/service/journal.proto). The
wheel ships no classes for them, so the few fields read here are declared here (``update_class``):

- ``acquire_iteration_client = 6`` (``iteration_client_id = 2``) and ``release_iteration_client
  = 7`` (``iteration_client_id = 1``): the clients attached to jobs (``aggregate``);
- ``snapshot = 15`` (``path = 1``): a ``distributed_save`` the dispatcher accepted (``snapshots``).

A file only grows, so ``JournalTail`` reads only what was appended since its last call, and
leaves a record still being written for the next one. The supervisor reads its journal from the
local disk (``LocalFileSystem``); the TensorFlow process reads through ``tf.io.gfile``
(``tfserver.GFileSystem``), which also reaches ``gs://``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import struct
from typing import Any, Protocol

JOURNAL_DIR = "tf_data_dispatcher_journal"
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
    for name, number, kind in (
        ("AcquireIterationClientUpdate", 2, field.TYPE_INT64),
        ("ReleaseIterationClientUpdate", 1, field.TYPE_INT64),
    ):
        file.message_type.add(name=name).field.add(name="client", number=number, type=kind, label=field.LABEL_OPTIONAL)
    file.message_type.add(name="SnapshotUpdate").field.add(
        name="path", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL
    )
    update = file.message_type.add(name="Update")
    for name, number, type_name in (
        ("acquire", 6, "AcquireIterationClientUpdate"),
        ("release", 7, "ReleaseIterationClientUpdate"),
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


class JournalTail:
    """The updates journaled in ``directory`` since the last call (not thread-safe: callers lock)."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self.fs = fs
        self.directory = directory
        self._offsets: dict[str, int] = {}

    def read(self) -> list[Any]:
        """The new updates, in order; [] while nothing is journaled. Raises OSError (or the file
        system's own error) when the journal cannot be read."""
        try:
            names = [n.rstrip("/") for n in self.fs.listdir(self.directory)]
        except FileNotFoundError:
            return []
        numbered = sorted((int(m.group(1)), n) for n in names if (m := _JOURNAL_FILE.fullmatch(n)))
        update = update_class()
        updates = []
        for _, name in numbered:
            offset = self._offsets.get(name, 0)
            data = self.fs.read(join(self.directory, name), offset)
            position = 0
            while len(data) - position >= _HEADER:
                (length,) = struct.unpack_from("<Q", data, position)
                end = position + _HEADER + length + _FOOTER
                if end > len(data):
                    break  # still being written (TensorFlow syncs whole records: only the last can be cut)
                message = update()
                message.ParseFromString(data[position + _HEADER : end - _FOOTER])
                updates.append(message)
                position = end
            self._offsets[name] = offset + position
        return updates
