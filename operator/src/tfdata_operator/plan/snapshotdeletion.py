"""What a TFDataSnapshot's finalizer does when the resource is deleted (``plan.snapshot``'s
docstring has the rules): ask the service's dispatcher to delete the data, wait, or let the
resource go, keeping the files and saying where they stay.

Pure: the controller (``controller/snapshots.py``) asks the dispatcher and removes the finalizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tfdata_operator.api import snapshot as snapshotapi
from tfdata_operator.api.identity import SNAPSHOT_FINALIZER
from tfdata_operator.api.snapshot import DELETE, SnapshotSpec
from tfdata_operator.plan.snapshot import (
    ABANDONED,
    DATA_KEPT,
    DELETION_WAITS,
    IN_PROGRESS,
    NOT_JOURNALED,
    PATH_TAKEN,
    POLL_SECONDS,
    TRIGGER_PENDING,
    Manifest,
    Target,
)


@dataclass(frozen=True)
class Deletion:
    """What the finalizer does now: ``delete_data`` asks the dispatcher; ``release`` removes the
    finalizer (after the data is deleted, when that is asked for)."""

    delete_data: bool = False
    release: bool = False
    reason: str = ""
    message: str = ""
    event_type: str = "Normal"
    requeue_after: float | None = None
    events: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)


def unseen_rivals(snap: SnapshotSpec, listed: Iterable[Manifest], seen: Iterable[str]) -> Deletion | None:
    """A wait, when the API server lists a TFDataSnapshot of the same name that the watch has not
    delivered (``seen``: the uids it has; after a restart it delivers them one by one): who keeps
    the path is settled from every one of them before data is deleted."""
    known = set(seen)
    unseen = [
        str(meta.get("name"))
        for body, meta in ((b, b.get("metadata") or {}) for b in listed)
        if meta.get("name") != snap.name
        and meta.get("uid") not in known
        and snapshotapi.snapshot_name(body) == snap.snapshot_name
    ]
    if not unseen:
        return None
    return Deletion(
        reason=DELETION_WAITS,
        message=f"the deletion waits: TFDataSnapshot {', '.join(sorted(unseen))} names the same snapshot, and the "
        "operator has not seen it yet; which one keeps the path is settled first",
        requeue_after=POLL_SECONDS,
    )


def deletion(snap: SnapshotSpec, target: Target, status: Manifest, fresh: bool) -> Deletion:
    """What the finalizer does for a TFDataSnapshot being deleted; ``fresh``: the dispatcher answered
    for the path in this reconcile (a snapshot that had not started may have started since)."""
    path = status.get("path") or target.path
    if snap.deletion_policy != DELETE:
        return Deletion(release=True)
    if target.reason == PATH_TAKEN:
        return Deletion(
            release=True,
            reason=DATA_KEPT,
            message=f"nothing was deleted: the path is TFDataSnapshot {target.taken_by}'s, and stays with it",
        )
    if not target.exists and status.get("state", TRIGGER_PENDING) == TRIGGER_PENDING and not status.get("startedAt"):
        return Deletion(release=True)  # no service, and none had started a snapshot: nothing to keep or delete
    if not target.exists:
        return Deletion(
            release=True,
            reason=DATA_KEPT,
            event_type="Warning",
            message=f"the files at {path or 'its path'} were not deleted: TFDataService {snap.service} is gone, "
            "and only its dispatcher deletes them safely. Delete them by hand",
        )
    if status.get("state") == IN_PROGRESS:
        return Deletion(
            reason=DELETION_WAITS,
            message=f"the deletion waits: {path} is being written, and TensorFlow cannot cancel a snapshot. "
            "Its data is deleted once it completes or fails; or remove the finalizer "
            f"{SNAPSHOT_FINALIZER} to keep the files and let the resource go now",
            requeue_after=POLL_SECONDS,
        )
    if status.get("state") == ABANDONED and status.get("reason") != NOT_JOURNALED:
        return Deletion(release=True)  # its files are gone, or were deleted already
    if status.get("state") == ABANDONED:
        return Deletion(
            release=True,
            reason=DATA_KEPT,
            event_type="Warning",
            message=f"the files at {path} were not deleted: they say the snapshot is being written, and the "
            "dispatcher deletes no snapshot in that state, though no dispatcher's journal names this one. "
            "Delete them by hand once no worker of an earlier dispatcher writes there",
        )
    if target.path is None:
        return Deletion(
            release=True,
            reason=DATA_KEPT,
            event_type="Warning",
            message=f"the files at {path or 'its path'} were not deleted: {target.message}",
        )
    if status.get("state", TRIGGER_PENDING) == TRIGGER_PENDING:
        if not fresh:
            return Deletion(
                reason=DELETION_WAITS,
                message=f"the deletion waits for the dispatcher to say whether anything was written at "
                f"{target.path} ({status.get('message', 'not read yet')}); or remove the finalizer "
                f"{SNAPSHOT_FINALIZER} to let the resource go without deleting anything",
                requeue_after=POLL_SECONDS,
            )
        return Deletion(release=True)
    return Deletion(delete_data=True)
