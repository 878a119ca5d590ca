"""A TFDataSnapshot's status, and what its deletion does, from what the service's dispatcher says.

The operator cannot start a snapshot: ``distributed_save`` needs the trainer's dataset, so a
trainer starts it (``client.snapshots.save``). The resource names it (service and name, hence
the path), and the operator follows it through the dispatcher's ``/v1/snapshots``, which reads
the files TensorFlow writes (the operator never reads shared storage itself):

- ``TRIGGER_PENDING``: nothing at the path yet, or the service cannot take a snapshot (no
  ``spec.snapshots``, no such service, a path holding something else); ``reason`` says which.
- ``IN_PROGRESS``, ``COMPLETED``, ``FAILED``: TensorFlow's own states (``ERROR``'s text in ``error``).
- ``ABANDONED``: nobody will finish it. Its files say it is being written, but the dispatcher's
  journal does not name it (a dispatcher that came back on a fresh journal: its node was lost), or
  its files went away after it had started.

Deletion with ``deletionPolicy: Delete`` (the finalizer, ``snapshotdeletion``): a snapshot being
written is left alone (TensorFlow has no cancel) and the deletion waits; otherwise the dispatcher
deletes the data (``DELETE /v1/snapshots``, which keeps the few files its journal needs to start
again), then the finalizer goes. A service that is gone has no dispatcher to ask: the finalizer
goes, and a Warning says where the files stay.

One path, one resource: of the TFDataSnapshots of a namespace that name one place (the same
service and name, or two services that share a directory), the one that keeps it (``Claim.rank``)
is followed and may delete it; the others say ``PathTaken`` and touch nothing, their deletion
included, until it is theirs. And once a save started, ``status.path`` is where the data is: a
later edit of the service's directory is said in the message, and never moves what is read or deleted.

Pure: the controller (``controller/snapshots.py``) reads, writes, and gives this what it saw.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tfdata_operator.api import limits, spec
from tfdata_operator.api import snapshot as snapshotapi
from tfdata_operator.api.snapshot import SnapshotSpec
from tfdata_operator.wire import snapshots as wire
from tfdata_operator.wire.snapshots import SnapshotProgress

Manifest = dict[str, Any]

TRIGGER_PENDING, IN_PROGRESS, COMPLETED, FAILED, ABANDONED = (
    "TRIGGER_PENDING",
    "IN_PROGRESS",
    "COMPLETED",
    "FAILED",
    "ABANDONED",
)
STATES = (TRIGGER_PENDING, IN_PROGRESS, COMPLETED, FAILED, ABANDONED)
# States that change only by a person's hand (the files are final, or nobody writes them):
# the dispatcher is not asked again.
FINAL = (COMPLETED, FAILED, ABANDONED)
# How often a snapshot that may still change is read (the dispatcher keeps a reading for 5 s).
POLL_SECONDS = 15.0
# How often a snapshot the service cannot take yet is looked at again (a service edited, created).
RECHECK_SECONDS = 30.0
# A snapshot being written that the journal does not name is ABANDONED only after this long since
# it started: TensorFlow writes the files and the journal entry one after the other.
UNJOURNALED_GRACE_SECONDS = 60.0

# Reasons (status.reason, and the Events').
SERVICE_NOT_FOUND = "ServiceNotFound"
NO_SNAPSHOT_STORAGE = "NoSnapshotStorage"
INVALID_SERVICE = "InvalidService"
INVALID_SPEC = "InvalidSpec"
WAITING_FOR_SAVE = "WaitingForSave"
PATH_UNUSABLE = "PathUnusable"
DISPATCHER_UNREADABLE = "DispatcherUnreadable"
WRITING = "Writing"
DONE = "Completed"
FAILED_REASON = "Failed"
NOT_JOURNALED = "NotJournaled"
FILES_GONE = "FilesGone"
DELETION_WAITS = "DeletionWaits"
DATA_DELETED = "DataDeleted"
DATA_KEPT = "DataKept"
DELETE_FAILED = "DataDeletionFailed"
DATA_BEING_DELETED = "DataBeingDeleted"
PATH_TAKEN = "PathTaken"


@dataclass(frozen=True)
class Target:
    """The service as far as this snapshot is concerned. ``path`` is the path followed and, with
    deletionPolicy Delete, deleted: ``status.path`` once a save started (``frozen_path``), else
    where the service's spec puts it. None when it cannot be followed; then ``reason`` and
    ``message`` say why."""

    path: str | None
    reason: str = ""
    message: str = ""
    exists: bool = True  # False: no such TFDataService
    taken_by: str = ""  # PATH_TAKEN: the TFDataSnapshot that keeps the path
    # Where the service's spec puts it today, when that is not ``path`` (its directory changed after the start).
    spec_path: str | None = None
    volume: str | None = None  # the claim the service mounts at its directory (spec.snapshots.volume)


@dataclass(frozen=True)
class Claim:
    """One TFDataSnapshot's hold on its path. Of those that name one place in a namespace, one keeps
    it (``rank``): one whose save started before one whose has not, else the one created first,
    else the first name. The others neither follow nor delete it (``PATH_TAKEN``)."""

    name: str  # metadata.name
    path: str
    volume: str | None
    started: bool
    created: str  # metadata.creationTimestamp (RFC 3339 in UTC: ordered as text)

    def rank(self) -> tuple[bool, str, str]:
        return (not self.started, self.created, self.name)

    def shares(self, other: Claim) -> bool:
        """Whether both name one place: the same path, unless each is on a claim of its own."""
        if _place(self.path) != _place(other.path):
            return False
        return self.volume is None or other.volume is None or self.volume == other.volume


def _place(path: str) -> str:
    """A path as compared: ``file:///x`` is ``/x``, and a local path's ``//`` and ``/./`` are one ``/``.
    Object stores' URLs are compared as written."""
    local = path.removeprefix("file://")
    return posixpath.normpath("/" + local.lstrip("/")) if local.startswith("/") else path.rstrip("/")


@dataclass(frozen=True)
class Unreadable:
    """The dispatcher's answer could not be had; ``why`` says what went wrong. ``retry_after``: the
    dispatcher is not asked again sooner (it is backed off, or its namespace's requests are at their cap)."""

    why: str
    retry_after: float = 0.0


Reading = SnapshotProgress | Unreadable


@dataclass(frozen=True)
class Observation:
    """The status to write, and the Events that say how it changed."""

    status: Manifest
    events: tuple[tuple[str, str, str], ...] = ()
    requeue_after: float | None = None


def target(
    snap: SnapshotSpec,
    service: Manifest | None,
    default_image: str | None,
    status: Manifest | None = None,
    rivals: Iterable[Claim] = (),
    *,
    allow_host_path: bool = False,
) -> Target:
    """Where the snapshot is, from its TFDataService as the cache has it (None: no such service) and
    its ``status`` (the path is frozen once a save started); refused (``PATH_TAKEN``) when one of
    ``rivals``, the other TFDataSnapshots of the namespace (``claim_of``), keeps that place.
    ``allow_host_path``: the operator's --allow-host-path-volumes, with which the service is parsed."""
    found = _target(snap, service, default_image, status or {}, allow_host_path)
    mine = claim(snap, found, status or {})
    if mine is None:
        return found
    taken = [c for c in rivals if c.name != snap.name and c.shares(mine) and c.rank() < mine.rank()]
    if not taken:
        return found
    owner = min(taken, key=Claim.rank)
    return Target(
        None,
        PATH_TAKEN,
        f"{mine.path} is TFDataSnapshot {owner.name}'s (created {owner.created or 'first'}"
        f"{', its save started' if owner.started else ''}): this one neither follows it nor, when deleted, "
        f"deletes it. It follows the path by itself once {owner.name} is deleted or names another path; "
        "to keep both, create this one again with another spec.snapshotName",
        taken_by=owner.name,
    )


def claim(snap: SnapshotSpec, target: Target, status: Manifest) -> Claim | None:
    """The place ``snap`` holds: its frozen path, else the path its service gives (None: neither)."""
    frozen = frozen_path(status)
    path = frozen or target.path
    if path is None:
        return None
    return Claim(snap.name, path, target.volume, frozen is not None, snap.created)


def claim_of(
    body: Manifest, service: Manifest | None, default_image: str | None, *, allow_host_path: bool = False
) -> Claim | None:
    """The place another TFDataSnapshot holds, from its body and its service's as the cache has them."""
    try:
        other = snapshotapi.parse(body)
    except spec.SpecError:
        return None
    status = body.get("status") or {}
    return claim(other, _target(other, service, default_image, status, allow_host_path), status)


def _target(
    snap: SnapshotSpec, service: Manifest | None, default_image: str | None, status: Manifest, allow_host_path: bool
) -> Target:
    if service is None:
        return Target(
            None,
            SERVICE_NOT_FOUND,
            f"TFDataService {snap.service} does not exist in namespace {snap.namespace}: create it, "
            "or create this snapshot for another service (spec.service cannot change)",
            exists=False,
        )
    try:
        svc = spec.parse(service, default_image, allow_host_path=allow_host_path)
    except spec.SpecError as exc:
        return Target(None, INVALID_SERVICE, f"TFDataService {snap.service} is invalid as written: {exc}")
    if svc.snapshots is None:
        return Target(
            None,
            NO_SNAPSHOT_STORAGE,
            f"TFDataService {snap.service} has no spec.snapshots, so it cannot take a snapshot: set "
            "spec.snapshots.directory to a URL every worker reaches (gs://bucket/path) or to a path with "
            "spec.snapshots.volume, a ReadWriteMany claim mounted in the dispatcher and every worker",
        )
    path, frozen, volume = snap.path(svc.snapshots), frozen_path(status), svc.snapshots.claim_name
    if frozen is not None and frozen != path:
        return Target(frozen, spec_path=path, volume=volume)
    return Target(path, volume=volume)


def frozen_path(status: Manifest) -> str | None:
    """``status.path`` once a save started (the state is past TRIGGER_PENDING): where the data is,
    whatever the service's ``spec.snapshots.directory`` says since."""
    path = status.get("path")
    if status.get("state", TRIGGER_PENDING) == TRIGGER_PENDING or not isinstance(path, str) or not path:
        return None
    return path


def needs_reading(old_status: Manifest, target: Target) -> bool:
    """Whether the dispatcher is asked: only for a snapshot that may still change, on a service that can take one."""
    return target.path is not None and old_status.get("state") not in FINAL


def observe(
    snap: SnapshotSpec, target: Target, reading: Reading | None, old_status: Manifest, now: datetime
) -> Observation:
    """The status from the last reading (None: not read, the state is final or the target unusable)."""
    status, requeue = _observed(snap, target, reading, old_status, now)
    if target.path is not None and (target.spec_path is not None or _MOVED in str(status.get("message", ""))):
        status = {**status, "message": _moved(str(status.get("message", "")), snap, target)}
    return _changed(snap, old_status, status, requeue)


def _observed(
    snap: SnapshotSpec, target: Target, reading: Reading | None, old_status: Manifest, now: datetime
) -> tuple[Manifest, float | None]:
    old_state = old_status.get("state") or TRIGGER_PENDING
    base = {k: v for k, v in old_status.items() if k not in ("reason", "message")}
    if target.path is None:
        status = {**base, "state": old_state, "reason": target.reason, "message": target.message}
        return status, RECHECK_SECONDS if old_state not in FINAL or target.reason == PATH_TAKEN else None
    base["path"] = target.path
    if reading is None:
        return {**old_status, "path": target.path}, None
    if isinstance(reading, Unreadable):
        status = {
            **base,
            "state": old_state,
            "reason": DISPATCHER_UNREADABLE,
            "message": f"the dispatcher's {wire.SNAPSHOTS_PATH} could not be read ({reading.why}); "
            f"the state is the last one read, and is read again in {max(POLL_SECONDS, reading.retry_after):.0f}s",
        }
        return status, max(POLL_SECONDS, reading.retry_after)
    state, reason, message = _state(snap, target.path, reading, old_state, now)
    status = {**base, **_progress(reading), "state": state, "reason": reason, "message": message}
    return status, None if state in FINAL else POLL_SECONDS


# Begins the last sentence of the status message while the service's directory is not where the
# snapshot is (the sentence goes when the directory is put back).
_MOVED = "Since this snapshot started, "


def _moved(message: str, snap: SnapshotSpec, target: Target) -> str:
    """``message`` with the sentence that says the service's directory moved, or without it."""
    kept = message.split(_MOVED, 1)[0].rstrip()
    if target.spec_path is None:
        return kept
    note = (
        f"{_MOVED}TFDataService {snap.service}'s spec.snapshots.directory changed: its data stays at "
        f"{target.path}, the only path the operator reads for it and, with deletionPolicy Delete, deletes. "
        f"A save of this name now goes to {target.spec_path}: create another TFDataSnapshot to follow that one"
    )
    room = limits.SNAPSHOT_STATUS["message"] - len(note) - 1
    return f"{limits.clip(kept, room)} {note}" if kept and room > len(limits.MARK) else note


def _state(
    snap: SnapshotSpec, path: str, reading: SnapshotProgress, old_state: str, now: datetime
) -> tuple[str, str, str]:
    started = old_state != TRIGGER_PENDING
    if reading.state == wire.MISSING:
        if started:
            return ABANDONED, FILES_GONE, f"{path} is gone: its files were removed after the snapshot had started"
        if reading.writable is False:
            return (
                TRIGGER_PENDING,
                PATH_UNUSABLE,
                f"the servers cannot write the snapshot at {path}: the dispatcher {reading.detail}. Make the "
                "directory writable for uid 1000 (the servers' user), or point spec.snapshots elsewhere",
            )
        return (
            TRIGGER_PENDING,
            WAITING_FOR_SAVE,
            f"nothing is at {path} yet: a trainer starts the snapshot with "
            f"tfdata_operator.client.snapshots.save(dataset, {snap.snapshot_name!r}, {snap.service!r})",
        )
    if reading.state == wire.DELETED:
        if started:
            return ABANDONED, DATA_DELETED, f"{reading.describe()}: its data was deleted"
        return (
            TRIGGER_PENDING,
            PATH_UNUSABLE,
            f"{path} holds a deleted snapshot's last files, which the dispatcher's journal may still need; "
            "TensorFlow refuses to save there again. Give this snapshot another name (spec.snapshotName)",
        )
    if reading.state == wire.UNKNOWN:
        if started:
            return (
                old_state,
                PATH_UNUSABLE,
                f"{path} could not be read ({reading.detail}); the state is the last one read",
            )
        return (
            TRIGGER_PENDING,
            PATH_UNUSABLE,
            f"{path} cannot take a snapshot: {reading.detail}. Nothing there was touched; give this "
            "snapshot another name (spec.snapshotName), or clear the path",
        )
    if reading.state == wire.IN_PROGRESS:
        age = now.timestamp() - reading.started_at if reading.started_at is not None else 0.0
        if not reading.journaled and age >= UNJOURNALED_GRACE_SECONDS:
            return (
                ABANDONED,
                NOT_JOURNALED,
                f"{path} was being written, but the dispatcher's journal does not name it: the dispatcher "
                "that started it is gone with its journal, and nobody will finish it. Its files stay; "
                "save it again under another name",
            )
        return IN_PROGRESS, WRITING, reading.describe()
    if reading.state == wire.COMPLETED:
        return COMPLETED, DONE, f"{reading.describe()}; read it with Dataset.load({path!r})"
    return FAILED, FAILED_REASON, reading.describe()


def _progress(reading: SnapshotProgress) -> Manifest:
    progress: Manifest = {
        "streams": f"{reading.streams_done}/{reading.streams_total}",
        "streamsDone": reading.streams_done,
        "streamsTotal": reading.streams_total,
        "chunks": reading.chunks,
        "elements": reading.elements,
        "bytes": reading.bytes,
    }
    if reading.started_at is not None:
        progress["startedAt"] = _timestamp(reading.started_at)
    if reading.finished_at is not None:
        progress["finishedAt"] = _timestamp(reading.finished_at)
    if reading.error:
        progress["error"] = reading.error[: wire.MAX_ERROR_CHARACTERS]
    return progress


def _timestamp(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_EVENTS = {
    IN_PROGRESS: ("Normal", "SnapshotStarted"),
    COMPLETED: ("Normal", "SnapshotCompleted"),
    FAILED: ("Warning", "SnapshotFailed"),
    ABANDONED: ("Warning", "SnapshotAbandoned"),
}

# Reasons that are a Warning Event when the status takes them.
_WARNED = (PATH_UNUSABLE, NO_SNAPSHOT_STORAGE, PATH_TAKEN)


def _changed(snap: SnapshotSpec, old: Manifest, new: Manifest, requeue: float | None) -> Observation:
    new = {k: v for k, v in new.items() if v is not None}
    events: tuple[tuple[str, str, str], ...] = ()
    state = new.get("state")
    if state != old.get("state") and state in _EVENTS:
        kind, reason = _EVENTS[state]
        events = ((kind, reason, str(new.get("message", ""))),)
    if new.get("reason") != old.get("reason") and new.get("reason") in _WARNED:
        events += (("Warning", str(new["reason"]), str(new.get("message", ""))),)
    return Observation(new, events, requeue)
