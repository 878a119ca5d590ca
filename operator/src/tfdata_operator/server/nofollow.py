"""A snapshot's files on this machine's disk, read, written and removed without following a link.

A trainer that mounts the service's snapshot volume (as it must, to load what was saved) can
plant symbolic links there: ``chunks -> /var/lib/tfdata`` for a DELETE to empty the journal
through, ``ERROR -> /proc/self/environ`` for a GET to quote. ``tf.io.gfile`` follows them (its
``DeleteRecursively`` asks ``stat``), so the dispatcher's ``/v1/snapshots`` reads a local snapshot
through ``NoFollowFileSystem`` instead: every directory at and below the snapshot's path is opened
relative to the one above it with ``O_NOFOLLOW``, so a link met there raises ``SymlinkError`` and
is never followed, also when it is planted between two calls. The snapshot's parent directory (the
service's snapshot directory) is the pods' own layout, and is opened as it is.

URLs (``gs://`` and other object stores) have no symbolic links: they stay with ``tf.io.gfile``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import urllib.parse
from collections.abc import Iterator

from tfdata_operator.server.journal import join

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class SymlinkError(OSError):
    """A symbolic link where a snapshot's file or directory was expected; never followed."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.ELOOP, "a symbolic link, which is never followed", path)

    def __str__(self) -> str:
        return f"{self.filename} is a symbolic link, which is never followed"


def local_path(path: str) -> str | None:
    """The path on this machine's disk that ``path`` names (TensorFlow's ``file://`` too); None for
    a URL of another file system."""
    if path.startswith("/"):
        return path
    if path.startswith("file://"):
        return urllib.parse.urlsplit(path).path or None
    return None


class NoFollowFileSystem:
    """``journal.WritableFileSystem`` for the tree at ``top`` (a path or a ``file://`` URL): every
    path it is given is ``top`` or below it, and no symbolic link at or below ``top`` is followed."""

    def __init__(self, top: str) -> None:
        # A top of "/" (no leaf) or a URL of another store: every path is refused (ValueError).
        self.top = top.rstrip("/")
        self._parent, self._leaf = os.path.split((local_path(top) or "").rstrip("/"))

    def listdir(self, path: str) -> list[str]:
        with self._directory(path) as fd:
            return os.listdir(fd)

    def size_and_mtime(self, path: str) -> tuple[int, float]:
        with self._holder(path) as (fd, name):
            info = self._lstat(fd, name, path)
        return info.st_size, info.st_mtime

    def read(self, path: str, offset: int = 0) -> bytes:
        with self._holder(path) as (holder, name):
            fd = self._open_file(holder, name, os.O_RDONLY, path)
        with os.fdopen(fd, "rb") as file:
            file.seek(offset)
            return file.read()

    def write(self, path: str, data: bytes) -> None:
        with self._holder(path) as (holder, name):
            fd = self._open_file(holder, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, path)
        with os.fdopen(fd, "wb") as file:
            file.write(data)

    def remove_tree(self, path: str) -> None:
        with self._holder(path) as (fd, name):
            _remove(fd, name, path)

    def symlinks(self, path: str) -> list[str]:
        """The symbolic links at and below ``path`` (it included), in the order walked."""
        with self._holder(path) as (holder, name):
            try:
                fd = self._open(holder, name, _DIRECTORY, path)
            except SymlinkError:
                return [path]
            except FileNotFoundError:  # nothing there, or a file: nothing below it
                return []
        try:
            return _links_below(fd, path)
        finally:
            os.close(fd)

    # --- walking down from top, one directory at a time --------------------------------------

    def _parts(self, path: str) -> list[str]:
        if path != self.top and not path.startswith(self.top + "/"):
            raise ValueError(f"{path!r} is not below {self.top!r}")
        below = path[len(self.top) :].strip("/")
        parts = [self._leaf, *(below.split("/") if below else [])]
        if any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{path!r} is not below {self.top!r}")
        return parts

    @contextlib.contextmanager
    def _holder(self, path: str) -> Iterator[tuple[int, str]]:
        """The open directory that holds ``path``, and its name there."""
        parts = self._parts(path)
        fd = os.open(self._parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            shown = self.top[: len(self.top) - len(self._leaf)].rstrip("/")
            for part in parts[:-1]:
                shown = join(shown, part)
                below = self._open(fd, part, _DIRECTORY, shown)
                os.close(fd)
                fd = below
            yield fd, parts[-1]
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _directory(self, path: str) -> Iterator[int]:
        with self._holder(path) as (holder, name):
            fd = self._open(holder, name, _DIRECTORY, path)
        try:
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _open(holder: int, name: str, flags: int, shown: str) -> int:
        try:
            return os.open(name, flags | os.O_NOFOLLOW, 0o666, dir_fd=holder)
        except OSError as exc:
            # O_NOFOLLOW answers ELOOP for a link, and with O_DIRECTORY ENOTDIR, as for a file.
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(holder, name):
                raise SymlinkError(shown) from None
            if exc.errno == errno.ENOTDIR:  # a file where a directory was expected: no snapshot there
                raise FileNotFoundError(errno.ENOENT, "not a directory", shown) from None
            raise

    @classmethod
    def _open_file(cls, holder: int, name: str, flags: int, shown: str) -> int:
        # O_NONBLOCK: a FIFO planted as ERROR would hold the open (and every reading) for good.
        fd = cls._open(holder, name, flags | os.O_NONBLOCK, shown)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", shown)
        os.set_blocking(fd, True)
        return fd

    @staticmethod
    def _lstat(holder: int, name: str, shown: str) -> os.stat_result:
        info = os.stat(name, dir_fd=holder, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            raise SymlinkError(shown)
        return info


def _is_link(holder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=holder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _links_below(fd: int, shown: str) -> list[str]:
    found = []
    with os.scandir(fd) as entries:
        for entry in entries:
            where = join(shown, entry.name)
            if entry.is_symlink():
                found.append(where)
            elif entry.is_dir(follow_symlinks=False):
                below = os.open(entry.name, _DIRECTORY, dir_fd=fd)
                try:
                    found += _links_below(below, where)
                finally:
                    os.close(below)
    return found


def _remove(holder: int, name: str, shown: str) -> None:
    """What ``shutil.rmtree`` does, relative to an open directory (its ``dir_fd`` needs Python 3.11):
    a link is removed as a link, its target untouched."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=holder, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=holder)
        return
    fd = NoFollowFileSystem._open(holder, name, _DIRECTORY, shown)
    try:
        for child in os.listdir(fd):
            _remove(fd, child, join(shown, child))
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=holder)
