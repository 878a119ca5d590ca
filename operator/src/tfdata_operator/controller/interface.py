"""What a reconcile of a TFDataService takes and gives back: the writes it makes (``Api``), the
objects the watches observed (``Observed``) and what it did (``Outcome``).

The handlers, the TFDataSnapshots' reconcile (``snapshots.py``) and every step of the reconcile
share these; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tfdata_operator.plan import snapshotdir

Manifest = dict[str, Any]


class Api(Protocol):
    """The writes a reconcile makes (``kube.Kube``; an in-memory fake in the unit tests)."""

    def apply(self, manifest: Manifest, dry_run: bool = False) -> Manifest: ...

    def find(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None: ...

    def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> bool: ...

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Manifest | None: ...

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Manifest) -> Manifest: ...

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: Manifest) -> Manifest: ...

    def patch_subresource(
        self, api_version: str, kind: str, namespace: str, name: str, subresource: str, patch: Manifest
    ) -> Manifest: ...

    def event(self, owner: Mapping[str, Any], event_type: str, reason: str, message: str) -> None: ...

    def scale(self, namespace: str, name: str, replicas: int) -> Manifest: ...

    def list_events(self, namespace: str, kind: str) -> list[Manifest]: ...

    def retain(self, volume: str) -> Manifest: ...


@dataclass(frozen=True)
class Observed:
    """A service's objects as the cache has them: every object with its instance label, and its pods."""

    objects: Mapping[tuple[str, str], Manifest] = field(default_factory=dict)
    pods: list[Manifest] = field(default_factory=list)
    # The other services' snapshot directories that may be this one's (``handlers.directory_claims``).
    directories: tuple[snapshotdir.DirectoryClaim, ...] = ()
    # With --kueue: the Kueue Workloads labelled with the service's name (``controller/kueue.py``).
    workloads: tuple[Manifest, ...] = ()


@dataclass
class Outcome:
    """What one reconcile did: its result (for the metrics) and every object it wrote."""

    result: str = "idle"
    written: list[Manifest] = field(default_factory=list)
    # Reconcile again after this many seconds even if nothing changes (the autoscaler's next
    # reading, or a held change re-checking its readers).
    requeue_after: float | None = None
    # Reconcile again after the work queue's back-off, as after a failure: what refused the change may
    # let it through later (another admission controller of the cluster).
    retry: bool = False


# HTTP codes with which the API server refuses an object for what it is, not for the moment:
# a retry would be refused again, so the user is told instead.
REFUSALS = (400, 403, 422)
