"""Follows one TFDataSnapshot: its status from the service's dispatcher, and its finalizer.

What the status says and what a deletion does is decided in ``plan/snapshot.py`` and
``plan/snapshotdeletion.py``; this module reads (the dispatcher's ``/v1/snapshots?path=P``, only
while the snapshot may still change) and writes (the status, when it differs; the finalizer;
Events on the TFDataSnapshot). It never reads the snapshot's storage: the dispatcher does, and
deletes the data when asked (``DELETE /v1/snapshots?path=P``).
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import limits, spec
from tfdata_operator.api import snapshot as snapshotapi
from tfdata_operator.api.identity import API_VERSION, SNAPSHOT_FINALIZER, SNAPSHOT_KIND
from tfdata_operator.controller import probes
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Outcome
from tfdata_operator.controller.readers import SnapshotReaders, Unasked, dispatcher_url
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import snapshot as plansnap
from tfdata_operator.plan import snapshotdeletion
from tfdata_operator.wire import snapshots as wire

log = logging.getLogger(__name__)
Manifest = dict[str, Any]
# Outcome.result of a reconcile that removed the finalizer of a TFDataSnapshot being deleted: it is
# gone, whatever a late watch event still says.
RELEASED = "released"


class Api(Protocol):
    """The writes this module makes (``kube.Kube``)."""

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: Manifest) -> Manifest: ...

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Manifest) -> Manifest: ...

    def event(self, owner: Mapping[str, Any], event_type: str, reason: str, message: str) -> None: ...

    def list_objects(self, api_version: str, kind: str, namespace: str) -> list[Manifest]: ...


@dataclass(frozen=True)
class Service:
    """The snapshot's TFDataService as the cache has it (``body`` None: there is none) and its children."""

    body: Manifest | None
    children: plan.Children | None = None


@dataclass(frozen=True)
class Rival:
    """Another TFDataSnapshot of the namespace with the same snapshot name (it may name the same
    path), as the watch has it, and its TFDataService's body as the cache has it (None: none)."""

    body: Manifest
    service: Manifest | None


def reconcile_snapshot(
    api: Api,
    config: OperatorConfig,
    body: Manifest,
    service: Service,
    readers: SnapshotReaders | None = None,
    rivals: Sequence[Rival] = (),
) -> Outcome:
    readers = readers or SnapshotReaders()
    outcome = Outcome()
    meta = body["metadata"]
    old: Manifest = dict(body.get("status") or {})
    try:
        snap = snapshotapi.parse(body)
    except spec.SpecError as exc:
        _write(api, body, old, {**old, "reason": plansnap.INVALID_SPEC, "message": f"Invalid spec: {exc}"}, outcome)
        return outcome
    allow = config.allow_host_path
    claims = [plansnap.claim_of(r.body, r.service, config.server_image, allow_host_path=allow) for r in rivals]
    target = plansnap.target(
        snap, service.body, config.server_image, old, [c for c in claims if c is not None], allow_host_path=allow
    )
    deleting = bool(meta.get("deletionTimestamp"))
    finalizers = list(meta.get("finalizers") or [])
    wants_finalizer = snap.deletion_policy == snapshotapi.DELETE
    if not deleting and wants_finalizer != (SNAPSHOT_FINALIZER in finalizers):
        body = _set_finalizer(api, body, wants_finalizer, outcome)

    reading: plansnap.Reading | None = None
    if plansnap.needs_reading(old, target) and target.path is not None:
        reading = _read(readers, snap.namespace, _url(service, config, target.path), target.path)
    observed = plansnap.observe(snap, target, reading, old, readers.clock())
    status, outcome.requeue_after = observed.status, observed.requeue_after
    release: snapshotdeletion.Deletion | None = None
    if deleting and SNAPSHOT_FINALIZER in finalizers:
        fresh = isinstance(reading, wire.SnapshotProgress)
        seen = [str(r.body["metadata"].get("uid")) for r in rivals]
        status, release = _finalize(api, config, snap, target, service, status, fresh, readers, seen, outcome)
    body = _write(api, body, old, status, outcome)
    for event_type, reason, message in observed.events:
        _event(api, body, event_type, reason, message)
    if release is not None:
        if release.reason:
            _event(api, body, release.event_type, release.reason, release.message)
        _set_finalizer(api, body, False, outcome)
        outcome.result = RELEASED
    return outcome


def _finalize(
    api: Api,
    config: OperatorConfig,
    snap: snapshotapi.SnapshotSpec,
    target: plansnap.Target,
    service: Service,
    status: Manifest,
    fresh: bool,
    readers: SnapshotReaders,
    seen: Sequence[str],
    outcome: Outcome,
) -> tuple[Manifest, snapshotdeletion.Deletion | None]:
    """The finalizer's work: the data deleted by the dispatcher when that is asked for and safe. The
    status to write, and the release (the finalizer to remove, with an Event) once it is done."""
    decision = snapshotdeletion.deletion(snap, target, status, fresh)
    if decision.delete_data and status.get("dataDeleted"):  # deleted before; the finalizer's patch failed
        return status, snapshotdeletion.Deletion(release=True)
    if decision.delete_data:
        # Who keeps the path was settled from the watch's TFDataSnapshots, which a restarted operator
        # receives one by one: before deleting, one list says the watch had them all (``seen``).
        listed = api.list_objects(API_VERSION, SNAPSHOT_KIND, snap.namespace)
        decision = snapshotdeletion.unseen_rivals(snap, listed, seen) or decision
    if decision.delete_data and target.path is not None:
        failed = readers.remove(snap.namespace, _url(service, config, target.path))
        if isinstance(failed, probes.UnderWay):  # not a failure: the finalizer stays until they are gone
            outcome.requeue_after = plansnap.POLL_SECONDS
            message = (
                f"the data at {target.path} is being deleted by the dispatcher ({failed}); the operator asks again "
                f"in {plansnap.POLL_SECONDS:.0f}s and lets the resource go once it is gone"
            )
            return {**status, "reason": plansnap.DATA_BEING_DELETED, "message": message}, None
        if failed is not None:
            again = max(plansnap.POLL_SECONDS, _retry_after(failed))
            message = (
                f"the data at {target.path} could not be deleted ({failed}); the deletion tries again in "
                f"{again:.0f}s. Remove the finalizer {SNAPSHOT_FINALIZER} to keep the files and "
                "let the resource go"
            )
            if target.spec_path is not None:  # the dispatcher deletes only in the directory it has now
                message += (
                    f". TFDataService {snap.service}'s spec.snapshots.directory no longer holds {target.path}: "
                    "put the directory back to have its dispatcher delete it"
                )
            outcome.requeue_after = again
            return {**status, "reason": plansnap.DELETE_FAILED, "message": message}, None
        decision = snapshotdeletion.Deletion(
            release=True,
            reason=plansnap.DATA_DELETED,
            message=f"the data at {target.path} was deleted by the dispatcher",
        )
    if decision.release:
        outcome.requeue_after = None
        return ({**status, "dataDeleted": True} if decision.reason == plansnap.DATA_DELETED else status), decision
    outcome.requeue_after = decision.requeue_after
    return {**status, "reason": decision.reason, "message": decision.message}, None


def _url(service: Service, config: OperatorConfig, path: str) -> str:
    assert service.body is not None and service.children is not None
    svc = spec.parse(service.body, config.server_image, allow_host_path=config.allow_host_path)
    query = urllib.parse.urlencode({wire.PATH_PARAMETER: path})
    return f"{dispatcher_url(svc, config, service.children, wire.SNAPSHOTS_PATH)}?{query}"


def _retry_after(why: str) -> float:
    return why.retry_after if isinstance(why, Unasked) else 0.0


def _read(readers: SnapshotReaders, namespace: str, url: str, path: str) -> plansnap.Reading:
    answer = readers.read(namespace, url)
    if isinstance(answer, str):
        return plansnap.Unreadable(answer, _retry_after(answer))
    entry = answer.get(path)
    return entry if entry is not None else plansnap.Unreadable(f"the answer has no entry for {path}")


def _write(api: Api, body: Manifest, old: Manifest, new: Manifest, outcome: Outcome) -> Manifest:
    """Writes the status if it differs; the body with the resourceVersion the write made (a finalizer
    patched after it is guarded by that one)."""
    new = {**new, "observedGeneration": body["metadata"].get("generation")}
    # TensorFlow's error and the dispatcher's words are in there: cut to the CRD, or the API server
    # refuses the whole patch and the state never moves on.
    new = limits.fit({k: v for k, v in new.items() if v is not None}, limits.SNAPSHOT_STATUS)
    if new == old:
        return body
    meta = body["metadata"]
    return _patched(
        lambda: api.patch_status(API_VERSION, SNAPSHOT_KIND, meta["namespace"], meta["name"], new), body, outcome
    )


def _set_finalizer(api: Api, body: Manifest, present: bool, outcome: Outcome) -> Manifest:
    """Adds or removes the finalizer, guarded by the resourceVersion read (a 409 is retried by the queue)."""
    meta = body["metadata"]
    finalizers = [f for f in meta.get("finalizers") or [] if f != SNAPSHOT_FINALIZER]
    if present:
        finalizers.append(SNAPSHOT_FINALIZER)
    patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}}
    return _patched(
        lambda: api.patch(API_VERSION, SNAPSHOT_KIND, meta["namespace"], meta["name"], patch), body, outcome
    )


def _patched(write: Callable[[], Manifest], body: Manifest, outcome: Outcome) -> Manifest:
    """One write: the body with the resourceVersion it made (a later write in the same reconcile is
    guarded by it), or as it was when the object is gone (404: deleted meanwhile)."""
    try:
        written = write()
    except ApiException as exc:
        if exc.status != 404:
            raise
        return body
    outcome.written.append(written)
    outcome.result = "changed"
    version = (written.get("metadata") or {}).get("resourceVersion")
    return {**body, "metadata": {**body["metadata"], "resourceVersion": version}} if version else body


def _event(api: Api, body: Manifest, event_type: str, reason: str, message: str) -> None:
    meta = body["metadata"]
    log.info("%s/%s: %s: %s", meta["namespace"], meta["name"], reason, message)
    api.event({**body, "apiVersion": API_VERSION, "kind": SNAPSHOT_KIND}, event_type, reason, message)
