"""The service's children (``plan.desired``): what they should be and which differ from what runs, the
changes dry-run together and then applied, and the children the spec no longer asks for deleted.

A name taken by an object the service does not own, or a change the API server or another admission
controller refuses, changes nothing and says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import reasons
from tfdata_operator.api.identity import MANAGER
from tfdata_operator.controller import faults, metrics
from tfdata_operator.controller.interface import REFUSALS, Api, Manifest
from tfdata_operator.controller.kube import admission_denial, describe_api_error, namespace_terminating, quota_refusal
from tfdata_operator.controller.run import Run
from tfdata_operator.plan import admission, hold
from tfdata_operator.plan import desired as plan

log = logging.getLogger(__name__)


# Requests of one reconcile that do not depend on each other are sent at once (the queue's workers
# each use a few of these threads).
_requests = ThreadPoolExecutor(max_workers=16, thread_name_prefix="request")
T = TypeVar("T")


def _each(call: Callable[[Manifest], T], manifests: list[Manifest]) -> list[T | BaseException]:
    """``call`` on every manifest at once; each result, or the exception it raised, in order."""
    if len(manifests) <= 1:
        return [_catching(call, m) for m in manifests]
    return list(_requests.map(lambda m: _catching(call, m), manifests))


def _catching(call: Callable[[Manifest], T], manifest: Manifest) -> T | BaseException:
    try:
        return call(manifest)
    except Exception as exc:
        return exc


def plan_children(run: Run) -> bool:
    """What the children should be (``plan.desired``), and which of them differ from what runs."""
    reported = (run.body.get("status") or {}).get("server")
    run.desired = plan.desired_children(
        hold.effective_spec(run.svc, run.decision),
        run.config.build,
        run.children,
        reported,
        max_unavailable=1 if run.drains.max_unavailable is None else run.drains.max_unavailable,
    )
    owned = run.children.objects
    if taken := [k for m in run.desired.apply if (k := plan.key(m)) in run.observed.objects and k not in owned]:
        run.report.conflict(run.svc, taken)
        return False
    run.changed = [m for m in run.desired.apply if plan.needs_apply(m, run.live.get(plan.key(m)))]
    return True


def dry_run(run: Run) -> bool:
    """Every change dry-run first (all at once: a dry run changes nothing): if the API server refuses any
    of them (a pod template it rejects, say), nothing is changed at all and the user is told why."""
    api, uid, live = run.api, run.body["metadata"]["uid"], run.live
    for manifest, result in zip(run.changed, _each(lambda m: api.apply(m, dry_run=True), run.changed), strict=True):
        if isinstance(result, ApiException) and namespace_terminating(result):
            raise result  # not the service's fault: the namespace, and the service with it, is going
        denied = admission_denial(result)
        if isinstance(result, ApiException) and (
            result.status in REFUSALS or _describes_object(result) or denied is not None
        ):
            if plan.key(manifest) not in live and _taken(api, manifest, uid):
                # The refusal is of someone else's object merged with ours: say whose the name is.
                run.report.conflict(run.svc, [plan.key(manifest)])
                return False
            if denied is not None:  # before a recreation: what another controller refuses is never deleted
                run.report.refused_by_admission(
                    run.svc, admission.explain(manifest, denied, live.get(plan.key(manifest)))
                )
                return False
            if (no_room := quota_refusal(result)) is not None:
                run.report.refused_by_quota(run.svc, admission.explain_quota(manifest, no_room))
                return False
            if _is_immutable_statefulset_change(manifest, result):
                _recreate(run, manifest)
                return False
            what = f"The API server refused the {manifest['kind']} {manifest['metadata']['name']}: "
            run.report.refused(run.svc, what + describe_api_error(result))
            return False
        if isinstance(result, BaseException):
            raise result
        if plan.key(manifest) not in live and _foreign(result, uid):
            # Not in the cache (which holds only objects with the operator's labels), yet it exists.
            run.report.conflict(run.svc, [plan.key(manifest)])
            return False
    faults.reached("after-dry-run")
    return True


def apply(run: Run) -> bool:
    """The changes, for real: the first alone (a fault point can stop the operator between it and the
    rest), then the others at once: they do not depend on each other, and a reconcile's latency is its
    round trips. One Event names everything created; every other change has its own."""
    applied: list[Manifest | BaseException] = []
    if run.changed:
        applied.append(_catching(run.api.apply, run.changed[0]))
        if not isinstance(applied[0], BaseException):
            faults.reached("after-first-apply")
            applied += _each(run.api.apply, run.changed[1:])
    created = []
    meta = run.body["metadata"]
    # A change the dry run let through may still be refused by an admission controller (a policy created
    # meanwhile, a webhook that answers otherwise): said once the changes that were made are recorded.
    refused: str | None = None
    no_room: str | None = None
    for manifest, result in zip(run.changed, applied, strict=False):
        if isinstance(result, BaseException):
            if (quota := quota_refusal(result)) is not None:  # used up since the dry run
                no_room = no_room or admission.explain_quota(manifest, quota)
                continue
            if (denied := admission_denial(result)) is None:
                raise result
            refused = refused or admission.explain(manifest, denied, run.live.get(plan.key(manifest)))
            continue
        before = run.live.get(plan.key(manifest))
        run.live[plan.key(manifest)] = result
        run.outcome.written.append(result)
        reason, message = plan.change_events(manifest, before, run.drains)
        if reason == reasons.CREATED:
            log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
            metrics.CHANGES.labels(reason).inc()
            created.append(f"{manifest['kind']} {manifest['metadata']['name']}")
        else:
            run.record(reason, message, "Warning" if reason in reasons.WARNINGS else "Normal")
    if created:
        run.api.event(run.body, "Normal", reasons.CREATED, "Created " + ", ".join(created))
    if refused is not None:
        run.report.refused_by_admission(run.svc, refused)
        return False
    if no_room is not None:
        run.report.refused_by_quota(run.svc, no_room)
        return False
    return True


def delete(run: Run) -> bool:
    """The children this spec no longer asks for (an HPA, a PodDisruptionBudget, a NetworkPolicy)."""
    namespace = run.body["metadata"]["namespace"]
    for api_version, kind, child in run.desired.delete:
        if run.api.delete(api_version, kind, namespace, child):
            run.record(reasons.DELETED, f"Deleted {kind} {child}")
            run.outcome.result = "changed"
    return True


def _foreign(result: Mapping[str, Any], uid: str) -> bool:
    """Whether a dry-run apply landed on an object that someone else created or owns."""
    meta = result.get("metadata") or {}
    owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
    # Controllers writing an object's status (the StatefulSet controller) do not make it someone else's.
    managers = {e.get("manager") for e in meta.get("managedFields") or [] if e.get("subresource") != "status"}
    return bool(owners - {uid}) or bool(managers - {MANAGER})


def _taken(api: Api, manifest: Manifest, uid: str) -> bool:
    meta = manifest["metadata"]
    existing = api.find(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
    return existing is not None and not plan.owned_by(existing, uid)


def _describes_object(exc: ApiException) -> bool:
    # A server-side apply of a wrongly typed field fails with 500 "failed to create typed patch object".
    return exc.status == 500 and "typed patch object" in describe_api_error(exc)


def _is_immutable_statefulset_change(manifest: Manifest, exc: ApiException) -> bool:
    return manifest["kind"] == "StatefulSet" and "updates to statefulset spec for fields other than" in (
        describe_api_error(exc)
    )


def _recreate(run: Run, manifest: Manifest) -> None:
    """A StatefulSet field that cannot be updated changed: delete it; the next reconcile creates it anew."""
    name = manifest["metadata"]["name"]
    current = run.live.get(("StatefulSet", name))
    uid = current["metadata"]["uid"] if current else None
    if run.api.delete("apps/v1", "StatefulSet", manifest["metadata"]["namespace"], name, uid=uid):
        run.record(
            reasons.RECREATING, f"Recreating StatefulSet {name}: a field Kubernetes cannot update in place changed"
        )
        run.outcome.result = "changed"
