"""One level-based reconcile of a TFDataService: from what the watches observed, apply what differs, report.

The work queue (``queue.py``) calls ``reconcile`` with a snapshot of the watches' cache, so
observing costs no request. It converges from any starting point, repairs drift, and writes
nothing when nothing differs. An invalid spec, a name taken by an object the service does
not own, or a child the API server refuses changes no child: it only sets
``Ready=False`` with the reason and records a Warning event once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from . import builders, faults, hold, metrics, plan, scaling, spec, status
from .builders import API_VERSION, KIND, MANAGER
from .config import OperatorConfig
from .kube import describe_api_error
from .signalclient import SignalReader
from .signals import SignalsError

log = logging.getLogger(__name__)
Manifest = dict[str, Any]


class Api(Protocol):
    """The writes a reconcile makes (``kube.Kube``; an in-memory fake in the unit tests)."""

    def apply(self, manifest: Manifest, dry_run: bool = False) -> Manifest: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str, uid: str | None = None) -> bool: ...

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Manifest) -> Manifest: ...

    def event(self, owner: Mapping[str, Any], event_type: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class Observed:
    """A service's objects as the cache has them: every object with its instance label, and its pods."""

    objects: Mapping[tuple[str, str], Manifest] = field(default_factory=dict)
    pods: list[Manifest] = field(default_factory=list)


@dataclass
class Outcome:
    """What one reconcile did: its result (for the metrics) and every object it wrote."""

    result: str = "idle"
    written: list[Manifest] = field(default_factory=list)
    # Reconcile again after this many seconds even if nothing changes (a held change re-checks its readers).
    requeue_after: float | None = None


# HTTP codes with which the API server refuses an object for what it is, not for the moment:
# a retry would be refused again, so the user is told instead.
_REFUSALS = (400, 403, 422)


def reconcile(
    api: Api, config: OperatorConfig, body: Manifest, observed: Observed, signals: SignalReader | None = None
) -> Outcome:
    """Converges one TFDataService from ``observed``; the caller keeps one reconcile per service at a time.

    ``signals`` reads the dispatcher's "is any client reading?" answer, asked only when a
    change that would break readers waits on it (``hold.py``).
    """
    outcome = Outcome()
    if body["metadata"].get("deletionTimestamp"):
        return outcome  # ownerReferences let the garbage collector remove the children
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    owned = {k: v for k, v in observed.objects.items() if plan.owned_by(v, uid)}
    children = plan.Children(name=name, objects=owned, pods=observed.pods)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    report = _Reporter(api, config, body, children, now, outcome)

    try:
        svc = spec.parse(body, config.server_image)
    except spec.SpecError as exc:
        report.refused(None, f"Invalid spec: {exc}")
        return outcome

    decision = _hold_decision(svc, body, children, signals)
    outcome.requeue_after = decision.requeue_after
    desired = plan.desired_children(hold.effective_spec(svc, decision), config.build, children)
    if taken := [k for m in desired.apply if (k := plan.key(m)) in observed.objects and k not in owned]:
        report.conflict(svc, taken)
        return outcome
    live = dict(owned)
    changed = [m for m in desired.apply if plan.needs_apply(m, live.get(plan.key(m)))]

    # Dry-run every change first: if the API server refuses any of them (a pod template it rejects,
    # say), nothing is changed at all and the user is told why.
    for manifest in changed:
        try:
            result = api.apply(manifest, dry_run=True)
        except ApiException as exc:
            if exc.status in _REFUSALS or _describes_object(exc):
                if _is_immutable_statefulset_change(manifest, exc):
                    _recreate(api, body, manifest, live, outcome)
                    return outcome
                what = f"The API server refused the {manifest['kind']} {manifest['metadata']['name']}: "
                report.refused(svc, what + describe_api_error(exc))
                return outcome
            raise
        if plan.key(manifest) not in live and _foreign(result, uid):
            # Not in the cache (which holds only objects with the operator's labels), yet it exists.
            report.conflict(svc, [plan.key(manifest)])
            return outcome
    faults.reached("after-dry-run")

    created = []
    for manifest in changed:
        before = live.get(plan.key(manifest))
        live[plan.key(manifest)] = applied = api.apply(manifest)
        outcome.written.append(applied)
        reason, message = plan.change_events(manifest, before)
        log.info("%s/%s: %s", namespace, name, message)
        metrics.CHANGES.labels(reason).inc()
        if reason == "Created":
            created.append(f"{manifest['kind']} {manifest['metadata']['name']}")
        else:
            api.event(body, "Normal", reason, message)
        faults.reached("after-first-apply")
    if created:
        api.event(body, "Normal", "Created", "Created " + ", ".join(created))

    statefulsets = (builders.dispatcher_name(svc), builders.workers_name(svc))
    for sts in (live.get(("StatefulSet", n)) for n in statefulsets):
        for pod in scaling.stuck_pods(sts, children.pods):
            _replace_pod(api, body, pod, "RestartedStuckPod", "it is not ready and runs an old configuration", outcome)
    for pod in scaling.stale_workers(svc, children.pods_of(builders.DISPATCHER), children.pods_of(builders.WORKER)):
        why = ("it registered with an earlier dispatcher pod, and without faultTolerantMode the new dispatcher "
               "hands out task ids the worker still holds")  # fmt: skip
        _replace_pod(api, body, pod, "RestartedStaleWorker", why, outcome)
    for api_version, kind, child in desired.delete:
        if api.delete(api_version, kind, namespace, child):
            log.info("%s/%s: Deleted %s %s", namespace, name, kind, child)
            metrics.CHANGES.labels("Deleted").inc()
            api.event(body, "Normal", "Deleted", f"Deleted {kind} {child}")
            outcome.result = "changed"

    _hold_events(api, body, svc, children, decision)
    if outcome.written:
        outcome.result = "changed"
    observed_now = status.Observed(
        dispatcher=live.get(("StatefulSet", builders.dispatcher_name(svc))),
        workers=live.get(("StatefulSet", builders.workers_name(svc))),
    )
    report.write(
        status.compute_status(svc, body, observed_now, config.build, now, waiting=desired.waiting, decision=decision)
    )
    return outcome


def _hold_decision(
    svc: spec.ServiceSpec, body: Manifest, children: plan.Children, signals: SignalReader | None
) -> hold.Decision:
    """Whether a change that would break readers goes ahead; the signal is read only if that depends on it."""
    live_list = scaling.live_worker_list(builders.read_config(children.dispatcher))
    pending = hold.pending_change(svc, children.dispatcher, children.workers, live_list)
    dispatcher_pods = children.pods_of(builders.DISPATCHER)
    running = hold.dispatcher_running(dispatcher_pods)
    signal: hold.Signal | None = None
    if hold.needs_signal(svc, pending, running):
        pod = next(p for p in dispatcher_pods if (p.get("status") or {}).get("phase") == "Running")
        if signals is None:
            signal = hold.Unknown("this operator has no way to read it")
        else:
            try:
                signal = signals(pod, svc.dispatcher.health_port)
            except SignalsError as exc:
                signal = hold.Unknown(str(exc))
    since = _parse_time(((body.get("status") or {}).get("held") or {}).get("since"))
    return hold.decide(svc, pending, running, signal, since, datetime.now(timezone.utc))


def _hold_events(
    api: Api, body: Manifest, svc: spec.ServiceSpec, children: plan.Children, decision: hold.Decision
) -> None:
    """An Event when a change starts to wait, when a waiting one is carried out, and on suspend and resume."""
    meta = body["metadata"]
    was_held = bool((body.get("status") or {}).get("held"))
    pending = decision.pending
    reason = ""
    event_type = "Normal"
    if decision.action == hold.HOLD and pending is not None and not was_held:
        reason = status.SUSPEND_HELD if pending.is_suspend else status.RESCALE_HELD
    elif decision.action == hold.FORCE:
        reason, event_type = "HeldChangeForced", "Warning"
    elif decision.action == hold.PROCEED and pending is not None and was_held:
        reason = "HeldChangeCarriedOut"
    if reason:
        log.info("%s/%s: %s", meta["namespace"], meta["name"], decision.message)
        metrics.CHANGES.labels(reason).inc()
        api.event(body, event_type, reason, decision.message)
    if decision.action != hold.HOLD and pending is not None and pending.is_suspend:
        message = "Suspending: every pod of the service stops; its Services, address and journal claim stay."
        api.event(body, "Normal", "Suspending", message)
    elif not svc.suspend and scaling.suspended(children.dispatcher):
        api.event(body, "Normal", "Resuming", "Resuming: the dispatcher and workers start again at the same address.")


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


@dataclass
class _Reporter:
    """Writes the status, and the Warning event of a refusal once (not on every reconcile)."""

    api: Api
    config: OperatorConfig
    body: Manifest
    children: plan.Children
    now: str
    outcome: Outcome

    def refused(self, svc: spec.ServiceSpec | None, message: str, reason: str = status.INVALID_SPEC) -> None:
        observed = status.Observed(dispatcher=self.children.dispatcher, workers=self.children.workers)
        new_status = status.compute_status(
            svc, self.body, observed, self.config.build, self.now, invalid=message, reason=reason
        )
        old_ready: Mapping[str, Any] = next(
            (c for c in (self.body.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {}
        )
        if old_ready.get("reason") != reason or old_ready.get("message") != message:
            meta = self.body["metadata"]
            log.warning("%s/%s: %s", meta["namespace"], meta["name"], message)
            self.api.event(self.body, "Warning", reason, message)
        self.outcome.result = "conflict" if reason == status.NAME_CONFLICT else "invalid"
        self.write(new_status)

    def conflict(self, svc: spec.ServiceSpec, taken: list[tuple[str, str]]) -> None:
        what = ", ".join(f"{kind} {child}" for kind, child in taken)
        namespace = self.body["metadata"]["namespace"]
        message = (
            f"{what} already exist(s) in namespace {namespace} and do(es) not belong to this TFDataService; "
            "nothing was changed. Delete or rename them, or give this TFDataService another name."
        )
        self.refused(svc, message, reason=status.NAME_CONFLICT)

    def write(self, new_status: Manifest) -> None:
        if not status.status_differs(self.body.get("status"), new_status):
            return
        meta = self.body["metadata"]
        try:
            written = self.api.patch_status(API_VERSION, KIND, meta["namespace"], meta["name"], new_status)
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to report on
                raise
            return
        self.outcome.written.append(written)
        if self.outcome.result == "idle":
            self.outcome.result = "changed"


def _foreign(result: Mapping[str, Any], uid: str) -> bool:
    """Whether a dry-run apply landed on an object that someone else created or owns."""
    meta = result.get("metadata") or {}
    owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
    # Controllers writing an object's status (the StatefulSet controller) do not make it someone else's.
    managers = {e.get("manager") for e in meta.get("managedFields") or [] if e.get("subresource") != "status"}
    return bool(owners - {uid}) or bool(managers - {MANAGER})


def _describes_object(exc: ApiException) -> bool:
    # A server-side apply of a wrongly typed field fails with 500 "failed to create typed patch object".
    return exc.status == 500 and "typed patch object" in describe_api_error(exc)


def _is_immutable_statefulset_change(manifest: Manifest, exc: ApiException) -> bool:
    return manifest["kind"] == "StatefulSet" and "updates to statefulset spec for fields other than" in (
        describe_api_error(exc)
    )


def _recreate(
    api: Api, body: Manifest, manifest: Manifest, live: dict[tuple[str, str], Manifest], outcome: Outcome
) -> None:
    """A StatefulSet field that cannot be updated changed: delete it; the next reconcile creates it anew."""
    name = manifest["metadata"]["name"]
    current = live.get(("StatefulSet", name))
    uid = current["metadata"]["uid"] if current else None
    if api.delete("apps/v1", "StatefulSet", manifest["metadata"]["namespace"], name, uid=uid):
        message = f"Recreating StatefulSet {name}: a field Kubernetes cannot update in place changed"
        log.info(message)
        metrics.CHANGES.labels("Recreating").inc()
        api.event(body, "Normal", "Recreating", message)
        outcome.result = "changed"


def _replace_pod(api: Api, body: Manifest, pod: Manifest, reason: str, why: str, outcome: Outcome) -> None:
    meta = pod["metadata"]
    if api.delete("v1", "Pod", meta["namespace"], meta["name"], uid=meta.get("uid")):
        message = f"Deleted pod {meta['name']}: {why}"
        log.info(message)
        metrics.CHANGES.labels(reason).inc()
        api.event(body, "Normal", reason, message)
        outcome.result = "changed"
