"""The dispatcher's ``/v1/snapshots``: how far each tf.data distributed snapshot got, from its files.

``distributed_save`` leaves no progress to ask for: the dispatcher's snapshot RPCs are not in
TensorFlow's Python API, and its only progress report is a log line. So this reads what the
workers write (``wire.snapshots`` has the layout) and the dispatcher's journal, which names every
snapshot path it accepted (``journal``: ``Update.snapshot.path``); ``snapshotfiles`` reads one
snapshot's files and carries out a deletion, and this module decides when, for whom, and at most
how many at once.

Where it runs: the files may be on ``gs://``, which only TensorFlow's file systems read, so the
reading happens in the TensorFlow process (``tfserver``, through ``tf.io.gfile``), which serves it
on a port of 127.0.0.1 and tells the supervisor that port in its status reports; the supervisor's
health port answers ``SNAPSHOTS_PATH`` by forwarding the request there (``snapshotproxy``). Nothing
here runs on the dispatcher's request path; ``tf.io.gfile`` lets go of the GIL while it lists,
stats and reads (``python/lib/io/file_io_wrapper.cc``), so a slow store does not hold up the
process's status reports either. A reading is reused for ``REREAD_SECONDS``
(``FINAL_REREAD_SECONDS`` once DONE or ERROR is there): a poll costs a few listings at most, and a
chunk's size is read once (committed chunks never change).

``DELETE SNAPSHOTS_PATH?path=P`` deletes a finished snapshot's data, here too, through the same
file system (``SnapshotReader.delete``): ``wire.snapshots.plan_deletion`` decides what goes, from
a listing of the path and a fresh read of the journal (a path journaled a moment ago must keep its
tombstone, or the dispatcher's next start fails). The checks and the tombstone's markers are
written before it answers; the files are removed in the background (at most ``MAX_REMOVALS`` at
once), and a DELETE again answers 200 once they are gone.

Whoever reaches the health port can ask, so what is asked is confined: a DELETE, and a GET of a
path the journal does not name, must name ``<snapshot_dir>/<name>`` (``wire.snapshots.confined``,
403 otherwise). A snapshot on this machine's disk is read and deleted through
``nofollow.NoFollowFileSystem`` (``snapshotfiles``), which never follows a symbolic link at or below its path: a
reading that meets one says UNKNOWN, and a DELETE of a tree that holds one removes nothing (409).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from tfdata_operator.server.journal import WritableFileSystem
from tfdata_operator.server.nofollow import NoFollowFileSystem, SymlinkError, local_path
from tfdata_operator.server.probestate import Reply
from tfdata_operator.server.snapshotfiles import (
    Journal,
    Reading,
    carry_out,
    error_detail,
    mark,
    read_progress,
    through_link,
    write_check,
)
from tfdata_operator.server.snapshotproxy import PROXY_TIMEOUT_SECONDS
from tfdata_operator.wire import snapshots
from tfdata_operator.wire.snapshots import (
    DeletionPlan,
    PathRefused,
    SnapshotDeletion,
    SnapshotProgress,
    SnapshotsError,
    SnapshotsReport,
)

REREAD_SECONDS = 5.0
FINAL_REREAD_SECONDS = 60.0
# Removals in the background at once; a DELETE beyond them starts nothing (503, ``under_way``).
MAX_REMOVALS = 2
# Readings of paths neither journaled nor asked for lately are forgotten beyond this many.
MAX_REMEMBERED = 512


# --- the reader the endpoint asks ---------------------------------------------------------------


@dataclass
class _Flight:
    """A reading of one path under way: the requests for the same path wait for it (``done``)."""

    done: threading.Event = field(default_factory=threading.Event)
    stale: bool = False  # a DELETE of the path ended meanwhile: what it read is not kept


@dataclass
class _Removal:
    """A DELETE under way, as a second one of the same path says it: its checks, or (``background``)
    the removal of the files it started."""

    started: float
    state_before: str = snapshots.UNKNOWN
    journaled: bool = False
    background: bool = False


class SnapshotReader:
    """Answers ``SNAPSHOTS_PATH`` from readings at most ``REREAD_SECONDS`` old; thread-safe.

    No lock is held while the store is asked: a path whose store is slow delays only the requests
    for that path. Requests for one path in a burst share one reading, the journal is read by one
    request at a time, and the snapshot directory is checked for writing at most once every
    ``REREAD_SECONDS`` whatever the number of missing paths asked (a trainer may ask 64 a request).
    """

    def __init__(
        self,
        fs: WritableFileSystem,
        work_dir: str | None,
        snapshot_dir: str | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        local_files: Callable[[str], WritableFileSystem] = NoFollowFileSystem,
    ) -> None:
        """``fs`` reads the journal, checks ``snapshot_dir`` for writing and reads snapshots at URLs;
        ``local_files(path)`` reads and deletes the snapshot at a local ``path``."""
        self._fs = fs
        self._snapshot_dir = snapshot_dir
        self._local_files = local_files
        self._clock_wall = wall_clock
        self._journal = Journal(fs, work_dir)
        self._clock = clock
        # Guards the dictionaries below; never held while the store is asked.
        self._lock = threading.Lock()
        self._readings: dict[str, Reading] = {}
        self._flights: dict[str, _Flight] = {}
        self._removals: dict[str, _Removal] = {}
        # How each removal in the background ended, until the next DELETE of its path says it.
        self._ended: dict[str, tuple[int, SnapshotDeletion]] = {}
        self._background = 0
        # One journal read at a time (its tail keeps where it read); the others use the last one.
        self._journal_lock = threading.Lock()
        self._journaled: list[str] = []
        self._journal_read_at: float | None = None
        self._journal_error: str | None = None
        # The last write check of the snapshot directory: (when, why not or None).
        self._check_lock = threading.Lock()
        self._checked: tuple[float, str | None] | None = None

    def report(self, paths: Iterable[str] = ()) -> SnapshotsReport:
        """The named paths, or, with none, every path the journal names. Raises PathRefused for a
        named path that is neither journaled nor in the snapshot directory."""
        asked = tuple(paths)
        journaled_paths, journal_error = self._read_journal()
        journaled = set(journaled_paths)
        for path in asked:
            if path not in journaled:
                snapshots.confined(path, self._snapshot_dir)
        progress = [self._progress(p, p in journaled) for p in (asked or journaled_paths)]
        with self._lock:
            self._forget(set(asked) | journaled)
        journal = self._journal.describe()
        if journal_error:
            journal += f" (cannot read it now: {journal_error})"
        return SnapshotsReport(tuple(progress), journal)

    def _read_journal(self, fresh: bool = False) -> tuple[list[str], str | None]:
        """The journaled paths, and why the journal cannot be read now (None: it can); read again
        once ``REREAD_SECONDS`` old, or now when ``fresh``. While another request reads it, the last
        paths read are used (unless ``fresh``, or none were read yet)."""
        if not self._journal_lock.acquire(blocking=fresh or self._journal_read_at is None):
            return self._journaled, self._journal_error
        try:
            now = self._clock()
            if fresh or self._journal_read_at is None or now - self._journal_read_at >= REREAD_SECONDS:
                self._journal_read_at = now
                try:
                    self._journaled = self._journal.paths()
                    self._journal_error = None
                except Exception as exc:  # keep the last paths read: a store failing for a moment
                    self._journal_error = error_detail(exc)
            return self._journaled, self._journal_error
        finally:
            self._journal_lock.release()

    def _progress(self, path: str, journaled: bool) -> SnapshotProgress:
        while True:
            with self._lock:
                now = self._clock()
                known = self._readings.get(path)
                if known is not None:
                    reread = FINAL_REREAD_SECONDS if known.progress.final else REREAD_SECONDS
                    if now - known.read_at < reread:
                        age = round(max(0.0, now - known.read_at), 3)
                        return replace(known.progress, journaled=journaled, age_seconds=age)
                flight = self._flights.get(path)
                if flight is None:
                    flight = self._flights[path] = _Flight()
                    break
            # Another request reads this path: its reading is this one's too.
            if not flight.done.wait(PROXY_TIMEOUT_SECONDS):
                return SnapshotProgress(
                    path,
                    snapshots.UNKNOWN,
                    journaled,
                    detail=f"a reading of its files has not finished in {PROXY_TIMEOUT_SECONDS:.0f}s: the store "
                    "is slow or does not answer",
                )
        try:
            reading = read_progress(self._files(path), path, journaled, known)
            if reading.progress.state == snapshots.MISSING and not journaled and self._snapshot_dir is not None:
                why = self._write_check(self._snapshot_dir)
                reading.progress = replace(reading.progress, writable=why is None, detail=why)
            reading.read_at = now
            with self._lock:
                if not flight.stale:
                    self._readings.pop(path, None)
                    self._readings[path] = reading  # last: the most recently read are forgotten last
            return reading.progress
        finally:
            with self._lock:
                del self._flights[path]
            flight.done.set()

    def _write_check(self, snapshot_dir: str) -> str | None:
        """``write_check`` of the snapshot directory, shared by every path asked within
        ``REREAD_SECONDS`` of it; while one is under way, the last one's answer."""
        if not self._check_lock.acquire(blocking=self._checked is None):
            checked = self._checked
            if checked is not None:
                return checked[1]
            self._check_lock.acquire()
        try:
            now = self._clock()
            if self._checked is not None and now - self._checked[0] < REREAD_SECONDS:
                return self._checked[1]
            why = write_check(self._fs, snapshot_dir)
            self._checked = (now, why)
            return why
        finally:
            self._check_lock.release()

    def _files(self, path: str) -> WritableFileSystem:
        return self._fs if local_path(path) is None else self._local_files(path)

    def _forget(self, keep: set[str]) -> None:
        for path in list(self._readings):
            if len(self._readings) <= MAX_REMEMBERED:
                return
            if path not in keep:
                del self._readings[path]

    def delete(self, path: str) -> tuple[int, SnapshotDeletion]:
        """Deletes the data of the snapshot at ``path`` (``plan_deletion``); (HTTP status, answer).

        What is refused is refused before it answers (409, 503), and so is a tombstone's marker
        written (``DELETED``, then ``ERROR``); the files are then removed in the background, and it
        answers at once: 409 with ``under_way`` (not a 2xx: an operator that knows no ``under_way``
        takes every 2xx as "deleted", and would let the resource go with the files still there).
        A DELETE while that removal is under way starts nothing and says so (409, ``under_way``);
        with ``MAX_REMOVALS`` under way for other paths, nothing is started (503, ``under_way``);
        once it has ended, the next DELETE says how (200, with what it removed, or 500 with the
        store's error, after which a DELETE again starts it again).

        Each step can be done again: a removal cut short (a store failing, the process stopped) is
        finished by the next DELETE, and one after a success removes nothing more. Readings go on
        meanwhile. Raises PathRefused for a path outside the snapshot directory, journaled or not.
        """
        snapshots.confined(path, self._snapshot_dir)
        with self._lock:
            removal = self._removals.get(path)
            ended = None if removal is not None else self._ended.pop(path, None)
            mine = _Removal(self._clock())
            if removal is None and (ended is None or ended[0] == 200):
                self._removals[path] = mine
        if removal is not None:
            took = max(0.0, self._clock() - removal.started)
            return 409, SnapshotDeletion(
                path,
                removal.state_before,
                removal.journaled,
                detail=f"a DELETE of this path started {took:.0f}s ago is still removing its files: nothing more was "
                "started; ask again later, it answers 200 once they are gone",
                under_way=True,
            )
        if ended is not None and ended[0] != 200:
            return ended  # once: the next DELETE tries again
        try:
            status, answer = self._delete(path, mine)
            if status == 200 and ended is not None and not answer.removed:
                return ended  # nothing more to do: what the removal in the background did
            return status, answer
        finally:
            with self._lock:
                if not mine.background:  # else its thread lets the path go once the files are gone
                    del self._removals[path]
                self._readings.pop(path, None)  # the next reading says what this left
                if (flight := self._flights.get(path)) is not None:
                    flight.stale = True

    def _delete(self, path: str, removal: _Removal) -> tuple[int, SnapshotDeletion]:
        journaled_paths, journal_error = self._read_journal(fresh=True)  # it may name the path since the last read
        journaled = path in journaled_paths
        if journal_error:
            return 503, SnapshotDeletion(
                path, snapshots.UNKNOWN, False, detail=f"cannot read the journal: {journal_error}"
            )
        files = self._files(path)
        try:
            names: list[str] | None = files.listdir(path)
        except FileNotFoundError:
            names = None
        except SymlinkError as exc:
            return 409, SnapshotDeletion(path, snapshots.UNKNOWN, journaled, detail=through_link(exc.filename))
        plan = snapshots.plan_deletion(names, journaled)
        with self._lock:
            removal.state_before, removal.journaled = plan.state_before, journaled
        if plan.refused:
            return 409, SnapshotDeletion(
                path, plan.state_before, journaled, kept=tuple(names or ()), detail=plan.refused
            )
        if plan.state_before == snapshots.MISSING:
            detail = "nothing at the path"
            if journaled:
                detail += (
                    ": this dispatcher's journal names it, so its next start fails (TensorFlow cannot resume a "
                    "snapshot whose path is gone)"
                )
            return 200, SnapshotDeletion(path, plan.state_before, journaled, detail=detail)
        if links := files.symlinks(path):
            detail = through_link(links[0]) + (f" ({len(links)} symbolic links in all)" if len(links) > 1 else "")
            return 409, SnapshotDeletion(path, plan.state_before, journaled, kept=tuple(names or ()), detail=detail)
        if not plan.remove and not plan.remove_all:  # a tombstone already: nothing to wait for
            return 200, carry_out(files, path, plan, self._clock_wall())
        return self._start_removal(files, path, plan, journaled, removal)

    def _start_removal(
        self, files: WritableFileSystem, path: str, plan: DeletionPlan, journaled: bool, removal: _Removal
    ) -> tuple[int, SnapshotDeletion]:
        """The tombstone's markers written, then the files removed on a thread of their own (``_remove``), at
        most ``MAX_REMOVALS`` at once (503 when that many are under way); 409 with ``under_way`` once started."""
        with self._lock:
            busy = self._background >= MAX_REMOVALS
            if not busy:
                self._background += 1
        if busy:
            return 503, SnapshotDeletion(
                path,
                plan.state_before,
                journaled,
                detail=f"this dispatcher is removing the files of {MAX_REMOVALS} other snapshots, as many as it "
                "removes at once: nothing was started for this one; ask again later",
                under_way=True,
            )
        try:
            marked = mark(files, path, plan, self._clock_wall())  # first, before any file goes
        except BaseException:
            with self._lock:
                self._background -= 1
            raise
        with self._lock:
            removal.background = True
        try:
            threading.Thread(
                target=self._remove, args=(files, path, marked), name=f"delete {path}", daemon=True
            ).start()
        except BaseException:  # no thread to start: nothing was started, as with a store failing
            with self._lock:
                removal.background = False
                self._background -= 1
            raise
        names_removed = len(plan.remove)
        return 409, SnapshotDeletion(
            path,
            plan.state_before,
            journaled,
            kept=plan.keep,
            detail=f"removing its files ({names_removed} names under the path"
            + (", and the path itself" if plan.remove_all else "")
            + ") in the background: ask again later, it answers 200 once they are gone",
            under_way=True,
        )

    def _remove(self, files: WritableFileSystem, path: str, plan: DeletionPlan) -> None:
        """The removal a DELETE started, on its own thread; the next DELETE of the path says how it ended."""
        try:
            ended = 200, carry_out(files, path, plan, self._clock_wall())
        except Exception as exc:  # the store's own errors: said to the next DELETE, as a DELETE's own would be
            ended = (
                500,
                SnapshotDeletion(
                    path,
                    plan.state_before,
                    plan.journaled,
                    detail=f"removing its files failed: {error_detail(exc)}; a DELETE again removes what is left",
                ),
            )
        with self._lock:
            self._background -= 1
            del self._removals[path]
            self._ended.pop(path, None)
            self._ended[path] = ended
            while len(self._ended) > MAX_REMEMBERED:  # the oldest first: paths nobody asks again
                del self._ended[next(iter(self._ended))]
            self._readings.pop(path, None)
            if (flight := self._flights.get(path)) is not None:
                flight.stale = True

    def delete_route(self, query: str) -> Reply:
        """``DELETE SNAPSHOTS_PATH?path=P`` in the TensorFlow process."""
        try:
            status, answer = self.delete(snapshots.deletion_path(urllib.parse.parse_qs(query, keep_blank_values=True)))
        except PathRefused as exc:
            return Reply.text(403, str(exc))
        except SnapshotsError as exc:
            return Reply.text(400, str(exc))
        return Reply(status, answer.to_json().encode() + b"\n", "application/json")

    def route(self, query: str) -> Reply:
        """``GET SNAPSHOTS_PATH?path=...`` in the TensorFlow process."""
        try:
            report = self.report(snapshots.query_paths(urllib.parse.parse_qs(query, keep_blank_values=True)))
        except PathRefused as exc:
            return Reply.text(403, str(exc))
        except SnapshotsError as exc:
            return Reply.text(400, str(exc))
        return Reply(200, report.to_json().encode() + b"\n", "application/json")
