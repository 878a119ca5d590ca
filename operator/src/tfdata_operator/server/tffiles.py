"""The dispatcher's files through TensorFlow's file systems (``tf.io.gfile``: local paths, ``gs://``
and the rest), for the TensorFlow process (``tfserver``): ``GFileSystem``, and the journal kept in
order around a start (its finished snapshots dropped before it is replayed, the static journals
beside it deleted once it has started). TensorFlow is imported when these are called."""

from __future__ import annotations

import logging

from tfdata_operator.server import journal
from tfdata_operator.server.nofollow import NoFollowFileSystem, local_path
from tfdata_operator.wire import serverconfig, snapshots
from tfdata_operator.wire.serverconfig import DispatcherServerConfig


class GFileSystem:
    """``journal.WritableFileSystem`` through ``tf.io.gfile``: local paths, ``gs://`` and every
    file system this TensorFlow registered."""

    def __init__(self) -> None:
        import tensorflow as tf

        self._gfile = tf.io.gfile
        self._not_found = tf.errors.NotFoundError

    def listdir(self, path: str) -> list[str]:
        try:
            return list(self._gfile.listdir(path))
        except self._not_found as exc:
            raise FileNotFoundError(path) from exc

    def size_and_mtime(self, path: str) -> tuple[int, float]:
        try:
            info = self._gfile.stat(path)
        except self._not_found as exc:
            raise FileNotFoundError(path) from exc
        return int(info.length), info.mtime_nsec / 1e9

    def read(self, path: str, offset: int = 0) -> bytes:
        try:
            with self._gfile.GFile(path, "rb") as file:
                if offset:
                    file.seek(offset)
                data: bytes = file.read()
                return data
        except self._not_found as exc:
            raise FileNotFoundError(path) from exc

    def write(self, path: str, data: bytes) -> None:
        with self._gfile.GFile(path, "wb") as file:
            file.write(data)

    def replace(self, source: str, target: str) -> None:
        self._gfile.rename(source, target, overwrite=True)

    def remove_tree(self, path: str) -> None:
        try:
            if self._gfile.isdir(path):
                self._gfile.rmtree(path)
            else:
                self._gfile.remove(path)
        except self._not_found as exc:
            raise FileNotFoundError(path) from exc

    def symlinks(self, path: str) -> list[str]:
        # Object stores have none; tf.io.gfile cannot tell one on this machine's disk (it follows them).
        return [] if local_path(path) is None else NoFollowFileSystem(path).symlinks(path)


def snapshot_finished(fs: journal.FileSystem, path: str) -> str | None:
    """Why the snapshot at ``path`` is over, from its files; None while it may still be written,
    or when they cannot be read now (it is kept: TensorFlow's start decides)."""
    try:
        names = {n.rstrip("/") for n in fs.listdir(path)}
    except FileNotFoundError:
        return "its path is gone"
    except Exception:  # the file system's own errors: a store failing for a moment
        return None
    if snapshots.DONE_FILE in names:
        return "completed"
    if snapshots.DELETED_FILE in names:
        return "its data was deleted"
    if snapshots.ERROR_FILE in names:
        return "failed"
    return None


def forget_finished_snapshots(work_dir: str, log: logging.Logger) -> None:
    """Before the dispatcher replays its journal, drops the finished snapshots from it
    (``journal.forget_finished_snapshots`` says why: else no snapshot saved after this start might
    ever be written). A failure is logged, and the journal replayed as it is."""
    fs = GFileSystem()
    try:
        dropped = journal.forget_finished_snapshots(
            fs, journal.join(work_dir, journal.JOURNAL_DIR), lambda path: snapshot_finished(fs, path)
        )
    except Exception as exc:  # tf.errors.OpError and friends
        log.warning("could not drop the finished snapshots from the journal in %s: %s", work_dir, exc)
        return
    for path, why in dropped:
        log.info("the journal no longer names the snapshot at %s (%s): it has nothing left to write", path, why)


def prune_old_journals(config: DispatcherServerConfig, log: logging.Logger) -> None:
    """Deletes the static journals beside this dispatcher's own: none is ever replayed again.

    Runs once this dispatcher has started on its own journal, so a failed start leaves
    everything as it was. A failure to delete is logged and otherwise ignored.
    """
    import tensorflow as tf

    assert config.work_dir is not None, "validate() checks it"
    parent, own = config.work_dir.rstrip("/").rsplit("/", 1)
    try:
        entries = tf.io.gfile.listdir(parent or "/")
    except Exception as exc:  # tf.errors.OpError and friends
        log.warning("could not list %s to delete old journals: %s", parent, exc)
        return
    for entry in sorted(e.rstrip("/") for e in entries):
        if entry == own or not serverconfig.STATIC_JOURNAL_NAME.fullmatch(entry):
            continue
        path = f"{parent}/{entry}"
        try:
            tf.io.gfile.rmtree(path)
            log.info("deleted the old journal %s (this dispatcher journals in %s)", path, config.work_dir)
        except Exception as exc:
            log.warning("could not delete the old journal %s: %s", path, exc)
