"""One level-based reconcile of a TFDataService: from what the watches observed, apply what differs, report.

The work queue (``workqueue.py``) calls ``reconcile`` with a snapshot of the watches' cache, so
observing costs no request. It converges from any starting point, repairs drift, and writes
nothing when nothing differs. An invalid spec, a name taken by an object the service does
not own, or a child the API server refuses changes no child: it only sets
``Ready=False`` with the reason and records a Warning event once.

It reads as its steps (``STEPS``), each a small function of one ``Run``: observe, validate,
autoscale, hold changes that would break readers, plan the children, dry-run the changes,
apply them, repair pods, replace pods on lost nodes, delete what is no longer wanted, announce
a hold, report the status.
``Run.record`` is what every change does: a log line, the changes metric, an Event.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import coretypes, limits, reasons, spec
from tfdata_operator.api.identity import API_VERSION, KIND, MANAGER
from tfdata_operator.autoscaling import policy as autoscaler
from tfdata_operator.autoscaling import status as autoscalestatus
from tfdata_operator.controller import cache, faults, metrics
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.kube import admission_denial, describe_api_error, namespace_terminating
from tfdata_operator.controller.readers import (
    Dispatcher,
    Readers,
    for_hold,
    kept_signal,
    kept_snapshots,
    read_signals,
    readiness,
    retry_after,
    server_info,
)
from tfdata_operator.plan import admission, drain, hold, lifecycle, nodeloss, scaling, snapshotdir, status
from tfdata_operator.plan import children as kinds
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan.diagnose import Finding, claims_to_read, explain, from_readiness, needs_events, unready_server
from tfdata_operator.render import builders
from tfdata_operator.wire.signals import ServiceSignals

log = logging.getLogger(__name__)
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


# HTTP codes with which the API server refuses an object for what it is, not for the moment:
# a retry would be refused again, so the user is told instead.
_REFUSALS = (400, 403, 422)


def reconcile(
    api: Api, config: OperatorConfig, body: Manifest, observed: Observed, readers: Readers | None = None
) -> Outcome:
    """Converges one TFDataService from ``observed``; the caller keeps one reconcile per service at a time.

    ``observe`` gathers what the cache holds, then each step of ``STEPS`` runs in order on the
    same ``Run``; a step that returns False has said why (the status, an Event) and ends the
    reconcile there.
    """
    if body["metadata"].get("deletionTimestamp"):
        return Outcome()  # ownerReferences let the garbage collector remove the children
    run = observe(api, config, body, observed, readers)
    for step in STEPS:
        if not step(run):
            break
    return run.outcome


@dataclass
class Run:
    """One reconcile: what it observed, and what each step decided for the next ones."""

    api: Api
    config: OperatorConfig
    body: Manifest
    observed: Observed
    # How the service's pods are read (None: they are not: what they would say is unknown).
    readers: Readers | None
    children: plan.Children
    now: str
    outcome: Outcome = field(default_factory=Outcome)
    svc: spec.ServiceSpec = field(init=False)
    auto_status: Manifest | None = None
    decision: hold.HoldDecision = field(default_factory=lambda: hold.HoldDecision(hold.PROCEED))
    drains: drain.DrainDecision = field(default_factory=lambda: drain.DrainDecision(1))
    desired: plan.Desired = field(default_factory=lambda: plan.Desired([], [], None))
    # The children as they are after this reconcile's writes, by (kind, name).
    live: dict[tuple[str, str], Manifest] = field(default_factory=dict)
    # The children whose manifests differ from what runs, in the order they are applied.
    changed: list[Manifest] = field(default_factory=list)
    # Pods on unreachable nodes: what was done, and what each StatefulSet's condition says meanwhile.
    node_loss: nodeloss.NodeLoss = field(default_factory=nodeloss.NodeLoss)
    # status.lifecycle (spec.lifecycle), as follow_lifecycle decided it.
    lifecycle_status: Manifest | None = None

    @property
    def report(self) -> _Reporter:
        return _Reporter(self.api, self.config, self.body, self.children, self.now, self.outcome)

    def record(self, reason: str, message: str, event_type: str = "Normal") -> None:
        """What every change does: a log line, the changes metric by reason, and an Event on the service."""
        meta = self.body["metadata"]
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
        metrics.CHANGES.labels(reason).inc()
        self.api.event(self.body, event_type, reason, message)


def observe(api: Api, config: OperatorConfig, body: Manifest, observed: Observed, readers: Readers | None) -> Run:
    """The service's own children, as the watches' cache has them: no request."""
    children = observe_children(body, observed)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Run(api, config, body, observed, readers, children, now, live=dict(children.objects))


def observe_children(body: Manifest, observed: Observed) -> plan.Children:
    """The objects of ``observed`` that this service owns (by uid: not a namesake's), and its pods."""
    uid = body["metadata"]["uid"]
    owned = {k: v for k, v in observed.objects.items() if plan.owned_by(v, uid)}
    return plan.Children(name=body["metadata"]["name"], objects=owned, pods=observed.pods)


def validate(run: Run) -> bool:
    """The spec parsed, defaulted and checked; an invalid one changes nothing and says why."""
    try:
        run.svc = spec.parse(run.body, run.config.server_image, allow_host_path=run.config.allow_host_path)
    except spec.SpecError as exc:
        run.report.refused(None, f"Invalid spec: {exc}")
        return False
    return True


def claim_snapshot_directory(run: Run) -> bool:
    """A ``spec.snapshots.directory`` another service keeps (``plan.snapshotdir``) changes nothing and says whose."""
    if run.svc.snapshots is None:
        return True
    client = run.children.objects.get(("ConfigMap", builders.client_configmap_name(run.svc)))
    mine = snapshotdir.claim_of(run.body, client)
    if mine is not None and (taken := snapshotdir.taken(mine, run.observed.directories)):
        run.report.refused(run.svc, taken.message, reason=reasons.SNAPSHOT_DIRECTORY_TAKEN)
        return False
    return True


def follow_lifecycle(run: Run) -> bool:
    """``spec.lifecycle`` (``plan.lifecycle``): the workload read by name, the dispatcher's signal
    read when the idle rule is due; then the service tied to its workload (ownerReferences), and
    suspended (in this same reconcile) or deleted when a rule says so."""
    svc, meta, api = run.svc, run.body["metadata"], run.api
    old = (run.body.get("status") or {}).get("lifecycle")
    ref = svc.lifecycle.workload
    workload: Manifest | lifecycle.Unreadable | None = None
    if ref is not None:
        try:
            # Kept NODE_READ_SECONDS: a burst of the service's events costs one read.
            workload = _read(api, run.readers, ref.api_version, ref.kind, svc.namespace, ref.name)
        except ApiException as exc:
            if exc.status not in _REFUSALS:
                raise
            workload = lifecycle.Unreadable(describe_api_error(exc) + _grant_hint(ref, exc))
    now = datetime.now(timezone.utc)
    signal: ServiceSignals | str | None = None
    running = hold.dispatcher_running(run.children.pods_of(builders.DISPATCHER))
    if lifecycle.needs_signal(svc, running, old, now):
        signal = read_signals(run.readers, _dispatcher(run))
    decision = lifecycle.decide(svc, workload, meta.get("ownerReferences") or [], old, signal, now)
    run.lifecycle_status = limits.fit(decision.status, limits.SERVICE_STATUS, "lifecycle")
    run.outcome.requeue_after = _sooner(run.outcome.requeue_after, _no_sooner(decision.requeue_after, signal))
    if decision.owner_references is not None:
        patch = {"metadata": {"ownerReferences": decision.owner_references, "resourceVersion": meta["resourceVersion"]}}
        written = api.patch(API_VERSION, KIND, svc.namespace, svc.name, patch)
        run.outcome.written.append(written)
        meta["resourceVersion"] = written["metadata"]["resourceVersion"]
        tied = any(
            r.get("uid") == (decision.status or {}).get("workload", {}).get("uid") for r in decision.owner_references
        )
        what = f"{ref.kind} {ref.name}" if ref is not None else "its former workload"
        log.info("%s/%s: %s", svc.namespace, svc.name, f"{'Tied to' if tied else 'Untied from'} {what}")
    for event_type, reason, message in decision.events:
        if reason in (reasons.LIFECYCLE_SUSPEND, reasons.LIFECYCLE_DELETE):
            run.record(reason, message, event_type)
        else:
            log.info("%s/%s: %s", svc.namespace, svc.name, message)
            api.event(run.body, event_type, reason, message)
    if decision.action == spec.LIFECYCLE_DELETE:
        # The status first: were the delete to fail, the next reconcile must not find it undone.
        run.report.write({"lifecycle": run.lifecycle_status})
        api.delete(API_VERSION, KIND, svc.namespace, svc.name, uid=meta["uid"])
        run.outcome.result = "changed"
        return False
    if decision.action == spec.LIFECYCLE_SUSPEND:
        written = api.patch(API_VERSION, KIND, svc.namespace, svc.name, {"spec": {"suspend": True}})
        run.outcome.written.append(written)
        meta["resourceVersion"] = written["metadata"]["resourceVersion"]
        run.svc = dataclasses.replace(svc, suspend=True)
    return True


def _grant_hint(ref: spec.WorkloadRef, exc: ApiException) -> str:
    if exc.status != 403:
        return ""
    group = ref.api_version.rpartition("/")[0] or '""'
    return (
        f" (grant the operator get on {kinds.plural_of(ref.kind)} in API group {group}: "
        "the chart's lifecycle.workloadKinds, docs/training-runs.md)"
    )


def autoscale(run: Run) -> bool:
    """The TFData autoscaler's turn (``_autoscale``): the worker count the children are built with."""
    if run.readers is not None:
        run.svc, run.auto_status = _autoscale(run, run.readers)
    return True


def hold_changes(run: Run) -> bool:
    """Whether a change that would break readers (a static rescale, a suspend) goes ahead now, and
    whether a drain may take a worker (the workers' disruption budget)."""
    run.decision = _hold_decision(run)
    run.drains = _drain_decision(run)
    return True


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
            result.status in _REFUSALS or _describes_object(result) or denied is not None
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
    for manifest, result in zip(run.changed, applied, strict=False):
        if isinstance(result, BaseException):
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
    return True


def repair_pods(run: Run) -> bool:
    """Pods a StatefulSet will not replace by itself: stuck on an old revision, or registered with an
    earlier dispatcher. Deleted, so that their StatefulSet recreates them."""
    svc, children = run.svc, run.children
    for sts in (run.live.get(("StatefulSet", n)) for n in (builders.dispatcher_name(svc), builders.workers_name(svc))):
        for pod in scaling.stuck_pods(sts, children.pods):
            _replace_pod(run, pod, reasons.RESTARTED_STUCK_POD, "it is not ready and runs an old configuration")
    for pod in scaling.stale_workers(svc, children.pods_of(builders.DISPATCHER), children.pods_of(builders.WORKER)):
        why = ("it registered with an earlier dispatcher pod, and without faultTolerantMode the new dispatcher "
               "hands out task ids the worker still holds")  # fmt: skip
        _replace_pod(run, pod, reasons.RESTARTED_STALE_WORKER, why)
    return True


def replace_lost_pods(run: Run) -> bool:
    """Pods on a node that stopped answering (``plan.nodeloss``): force-deleted, so that their
    StatefulSet recreates them on another node, at once when the node is known to be off (tainted
    out-of-service, or its Node deleted), after a timeout when it is only unreachable and that harms
    nothing. A dispatcher whose journal only that node reaches has its volume set to Retain, then
    loses its claim. Only the Nodes of pods that are not Ready are read (no Node watch: it would hold
    every Node of a big cluster)."""
    svc, readers, namespace = run.svc, run.readers, run.body["metadata"]["namespace"]
    pods = [*run.children.pods_of(builders.DISPATCHER), *run.children.pods_of(builders.WORKER)]
    names = {n for p in pods if (n := nodeloss.node_to_read(p))}
    now = datetime.now(timezone.utc)
    stuck = nodeloss.unscheduled_dispatcher(svc, run.children.pods_of(builders.DISPATCHER), now)
    if not names and stuck is None:
        return True
    nodes = {n: _read(run.api, readers, "v1", "Node", None, n) for n in sorted(names)}
    lost = nodeloss.lost_pods(pods, nodes)
    if stuck is not None and (stranded := _stranded_dispatcher(run, stuck)) is not None:
        lost.append(stranded)
    kept: nodeloss.Journal | None = None
    if (dispatcher_lost := nodeloss.journal_to_read(svc, lost, now)) is not None:
        claim = nodeloss.journal_claim(svc, dispatcher_lost.pod)
        assert claim is not None
        bound = _read(run.api, readers, "v1", "PersistentVolumeClaim", namespace, claim)
        volume = ((bound or {}).get("spec") or {}).get("volumeName")
        pv = _read(run.api, readers, "v1", "PersistentVolume", None, volume) if volume else None
        kept = nodeloss.journal(claim, bound, pv, dispatcher_lost.node)
    saving = None
    if nodeloss.needs_snapshots(svc, lost, now):
        saves, again = kept_snapshots(run.readers, _dispatcher(run))
        run.outcome.requeue_after = _sooner(run.outcome.requeue_after, again)
        saving = hold.writing(svc, saves)
    run.node_loss = nodeloss.decide(svc, lost, kept, now, saving)
    run.outcome.requeue_after = _sooner(run.outcome.requeue_after, run.node_loss.requeue_after)
    for replacement in run.node_loss.replace:
        meta = replacement.pod["metadata"]
        if replacement.retain is not None:
            # Before the claim goes: with reclaim Delete (local-path's), the provisioner would delete the old
            # journal's data when the node comes back. A failed patch raises, and nothing is deleted.
            run.api.retain(replacement.retain)
            log.info("%s/%s: set PersistentVolume %s (the journal of pod %s) to Retain", namespace, svc.name,
                     replacement.retain, meta["name"])  # fmt: skip
        if replacement.claim is not None:
            # First, or the StatefulSet controller would recreate the pod on the old claim, bound to the lost
            # node. The claim stays Terminating (pvc-protection) until the pod object is gone, and meanwhile the
            # controller refuses to create the pod ("pvc ... is being deleted", stateful_pod_control.go's
            # createPersistentVolumeClaims) and retries; then it creates a new claim and the pod.
            uid = kept.uid if kept is not None and kept.claim == replacement.claim else None
            run.api.delete("v1", "PersistentVolumeClaim", namespace, replacement.claim, uid=uid)
        # gracePeriodSeconds 0 removes the object at once: no kubelet will ever confirm the pod stopped.
        if run.api.delete("v1", "Pod", namespace, meta["name"], uid=meta.get("uid"), grace_period_seconds=0):
            run.record(replacement.reason, replacement.message, replacement.event_type)
            run.outcome.result = "changed"
    dispatcher_pod = f"{builders.dispatcher_name(svc)}-0"
    for worker in nodeloss.stranded_workers(run.node_loss, dispatcher_pod, run.children.pods_of(builders.WORKER)):
        why = "it was registered with the dispatcher pod lost with its node, and would not reach the new one"
        _replace_pod(run, worker, reasons.RESTARTED_STALE_WORKER, why)
    # Waits that only certainty ends: a Warning each, once (not again while the condition says so).
    dispatcher, workers = run.node_loss.dispatcher, run.node_loss.workers
    if dispatcher is not None and dispatcher.reason == reasons.DISPATCHER_NODE_LOST:
        _warn_once(run, reasons.DISPATCHER_READY, dispatcher.reason, f"The dispatcher's {dispatcher.message}")
    if workers is not None and workers.reason == reasons.KEPT_FOR_SNAPSHOT:
        _warn_once(run, reasons.WORKERS_READY, workers.reason, f"Kept worker {workers.message}")
    return True


def _warn_once(run: Run, condition: str, reason: str, message: str) -> None:
    """A Warning Event, unless the service's ``condition`` already has that reason (it was sent then)."""
    old = (run.body.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == condition and c.get("reason") == reason for c in old):
        run.record(reason, message, "Warning")


def _stranded_dispatcher(run: Run, pod: Manifest) -> nodeloss.Lost | None:
    """An unscheduled dispatcher pod whose journal claim is bound to a volume pinned to a node that is
    known to be off (``nodeloss.stranded_dispatcher``): its claim, volume and that node are read (each
    kept NODE_READ_SECONDS). A claim not bound yet (a new service) costs one read."""
    claim = nodeloss.journal_claim(run.svc, pod)
    assert claim is not None
    bound = _read(run.api, run.readers, "v1", "PersistentVolumeClaim", run.svc.namespace, claim)
    volume = ((bound or {}).get("spec") or {}).get("volumeName")
    pv = _read(run.api, run.readers, "v1", "PersistentVolume", None, volume) if volume else None
    node = nodeloss.pinned_node(pv)
    if node is None:
        return None
    return nodeloss.stranded_dispatcher(pod, node, _read(run.api, run.readers, "v1", "Node", None, node))


def delete(run: Run) -> bool:
    """The children this spec no longer asks for (an HPA, a PodDisruptionBudget, a NetworkPolicy)."""
    namespace = run.body["metadata"]["namespace"]
    for api_version, kind, child in run.desired.delete:
        if run.api.delete(api_version, kind, namespace, child):
            run.record(reasons.DELETED, f"Deleted {kind} {child}")
            run.outcome.result = "changed"
    return True


def announce_hold(run: Run) -> bool:
    """An Event when a change starts to wait, when a waiting one is carried out, and on suspend and resume."""
    was_held = bool((run.body.get("status") or {}).get("held"))
    decision, pending = run.decision, run.decision.pending
    if decision.action == hold.HOLD and pending is not None and not was_held:
        run.record(reasons.SUSPEND_HELD if pending.is_suspend else reasons.RESCALE_HELD, decision.message)
    elif decision.action == hold.FORCE:
        run.record(reasons.HELD_CHANGE_FORCED, decision.message, "Warning")
    elif decision.action == hold.PROCEED and pending is not None and was_held:
        run.record(reasons.HELD_CHANGE_CARRIED_OUT, decision.message)
    if decision.action != hold.HOLD and pending is not None and pending.is_suspend:
        message = "Suspending: every pod of the service stops; its Services, address and journal claim stay."
        run.api.event(run.body, "Normal", reasons.SUSPENDING, message)
    elif not run.svc.suspend and scaling.suspended(run.children.dispatcher):
        message = "Resuming: the dispatcher and workers start again at the same address."
        run.api.event(run.body, "Normal", reasons.RESUMING, message)
    return True


def report_status(run: Run) -> bool:
    """The status, recomputed from the children as they are now (and why they do not serve, if they do not)."""
    if run.outcome.written:
        run.outcome.result = "changed"
    svc, children, readers = run.svc, run.children, run.readers
    dispatcher_sts = run.live.get(("StatefulSet", builders.dispatcher_name(svc)))
    workers_sts = run.live.get(("StatefulSet", builders.workers_name(svc)))
    servers = status.Servers(
        dispatcher=dispatcher_sts,
        workers=workers_sts,
        dispatcher_problem=run.node_loss.dispatcher
        or _explain(
            run.api,
            run.config,
            dispatcher_sts,
            children.pods_of(builders.DISPATCHER),
            svc.dispatcher.health_port,
            readers,
        ),
        workers_problem=run.node_loss.workers
        or _explain(
            run.api, run.config, workers_sts, children.pods_of(builders.WORKER), svc.workers.health_port, readers
        ),
        **_server_info(run),
    )
    new_status = status.compute_status(
        svc,
        run.body,
        servers,
        run.config.build,
        run.now,
        waiting=run.desired.waiting,
        decision=run.decision,
        drains=run.drains,
    )
    new_status["autoscaling"] = run.auto_status
    new_status["lifecycle"] = run.lifecycle_status
    run.report.write(new_status)
    return True


Step = Callable[[Run], bool]
# The reconcile, in order (after ``observe``): each step is a small function of the same ``Run``.
STEPS: tuple[Step, ...] = (
    validate,
    claim_snapshot_directory,
    follow_lifecycle,
    autoscale,
    hold_changes,
    plan_children,
    dry_run,
    apply,
    repair_pods,
    replace_lost_pods,
    delete,
    announce_hold,
    report_status,
)


def _autoscale(run: Run, readers: Readers) -> tuple[spec.ServiceSpec, Manifest | None]:
    """The TFData autoscaler's turn: read the dispatcher's signals when due, decide, and scale.

    Returns the spec to build the children from (with the new worker count) and the
    ``status.autoscaling`` block (None removes it: the service is not autoscaled on TFData).
    """
    svc, body, outcome = run.svc, run.body, run.outcome
    key = (svc.namespace, svc.name)
    old = (body.get("status") or {}).get("autoscaling")
    if svc.autoscaling is None or not builders.reads_signals(svc):
        readers.windows.forget(key)
        return svc, None
    if svc.suspend:
        return svc, old  # paused: no pods to read, and a resume starts from the count it left
    now = readers.clock()
    window = readers.windows.get(key)
    if not readers.windows.due(key, now):
        outcome.requeue_after = max(0.5, window.next_at - now)
        return svc, old
    if window.history == autoscaler.History() and not window.samples:
        window.history = autoscalestatus.history_from_status(old)  # a restarted operator
    fetched = read_signals(readers, _dispatcher(run))
    decision = readers.windows.decide(key, autoscaler.Policy.of(svc.autoscaling), svc.workers.replicas, fetched, now)
    # A dispatcher not asked (backed off, or its namespace's reads at their cap) is asked when it may be.
    outcome.requeue_after = _later(decision.next_check_seconds, retry_after(fetched))
    if decision.scales:
        scale = run.api.scale(svc.namespace, svc.name, decision.replicas)
        # The Scale's resourceVersion is the TFDataService's: the cache shows the new count at once.
        scaled = copy.deepcopy(body)
        scaled["spec"].setdefault("workers", {})["replicas"] = decision.replicas
        scaled["metadata"]["resourceVersion"] = scale["metadata"]["resourceVersion"]
        scaled.pop("status", None)
        outcome.written.append(scaled)
        run.record(reasons.SCALED, autoscalestatus.event_message(decision))
        svc = dataclasses.replace(svc, workers=dataclasses.replace(svc.workers, replicas=decision.replicas))
    return svc, autoscalestatus.build(old, decision, window, datetime.now(timezone.utc))


def _dispatcher(run: Run) -> Dispatcher:
    return Dispatcher(run.svc, run.config, run.children)


def _hold_decision(run: Run) -> hold.HoldDecision:
    """Whether a change that would break readers or take workers away goes ahead (``plan.hold``), from
    what the dispatcher says (``readers.for_hold``: the same ``/v1/signals`` answer the TFData
    autoscaler reads). A dispatcher not asked is asked again when it may be, not sooner."""
    svc, children = run.svc, run.children
    live_list = scaling.live_worker_list(builders.read_config(children.dispatcher))
    pending = hold.pending_change(svc, children.dispatcher, children.workers, live_list)
    running = hold.dispatcher_running(children.pods_of(builders.DISPATCHER))
    saves, signal = for_hold(run.readers, _dispatcher(run), pending, running)
    since = coretypes.parse_time(((run.body.get("status") or {}).get("held") or {}).get("since"))
    decision = hold.decide(svc, pending, running, signal, since, datetime.now(timezone.utc), saves)
    run.outcome.requeue_after = _sooner(run.outcome.requeue_after, _no_sooner(decision.requeue_after, saves, signal))
    return decision


def _drain_decision(run: Run) -> drain.DrainDecision:
    """The workers' disruption budget (``plan.drain``). The signal is read only when the budget depends
    on it (a static WhenIdle service whose dispatcher and workers run), and at most once per
    ``drain.valid_for`` of the last reading; the snapshots likewise (a service with spec.snapshots),
    at most once per ``drain.RECHECK_SECONDS`` (``readers.kept_signal``, ``kept_snapshots``)."""
    svc, children = run.svc, run.children
    running = hold.dispatcher_running(children.pods_of(builders.DISPATCHER))
    workers = len(children.pods_of(builders.WORKER))
    drains = (run.body.get("status") or {}).get("drains") or {}
    since, unreadable_since = (
        coretypes.parse_time(drains.get("since")),
        coretypes.parse_time(drains.get("unreadableSince")),
    )
    signal: hold.Signal | None = None
    if drain.needs_signal(svc, running, workers):
        signal, again = kept_signal(run.readers, _dispatcher(run))
        run.outcome.requeue_after = _sooner(run.outcome.requeue_after, again)
    saves: hold.Snapshots | None = None
    if drain.needs_snapshots(svc, running, workers):
        saves, again = kept_snapshots(run.readers, _dispatcher(run))
        run.outcome.requeue_after = _sooner(run.outcome.requeue_after, again)
    now = datetime.now(timezone.utc)
    decision = drain.decide(
        svc, running, workers, signal, since, now, saves, unreadable_since, run.config.drain_max_wait_seconds
    )
    requeue = decision.requeue_after
    if requeue is not None:
        requeue = _later(requeue, retry_after(signal, saves))
    run.outcome.requeue_after = _sooner(run.outcome.requeue_after, requeue)
    return decision


def _server_info(run: Run) -> dict[str, Any]:
    """What the ready dispatcher pod runs, when it is known and not yet in the status (``readers.server_info``)."""
    if run.readers is None:
        return {}
    reported = ((run.body.get("status") or {}).get("server") or {}).get("pod")
    found, again = server_info(
        run.readers, run.children.pods_of(builders.DISPATCHER), reported, run.svc.dispatcher.health_port
    )
    run.outcome.requeue_after = _sooner(run.outcome.requeue_after, again)
    return found


def _later(a: float, b: float | None) -> float:
    """The later of a requeue delay and a pod's back-off (None: none)."""
    return a if b is None else max(a, b)


def _no_sooner(requeue: float | None, *answers: object) -> float | None:
    """A decision's requeue delay, no sooner than the answers that were not asked may be asked
    (``readers.retry_after``): a pod backed off is not polled by the reconciles it holds up."""
    again = retry_after(*answers)
    return again if requeue is None else _later(requeue, again)


def _sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two requeue delays (None: no requeue asked)."""
    return b if a is None else a if b is None else min(a, b)


@dataclass
class _Reporter:
    """Writes the status, and the Warning event of a refusal once (not on every reconcile)."""

    api: Api
    config: OperatorConfig
    body: Manifest
    children: plan.Children
    now: str
    outcome: Outcome

    def refused(self, svc: spec.ServiceSpec | None, message: str, reason: str = reasons.INVALID_SPEC) -> None:
        observed = status.Servers(dispatcher=self.children.dispatcher, workers=self.children.workers)
        new_status = status.compute_status(
            svc, self.body, observed, self.config.build, self.now, invalid=message, reason=reason
        )
        old_ready, new_ready = _ready_condition(self.body.get("status")), _ready_condition(new_status)
        # Compared as written (the message cut to the CRD's bound): one Event per refusal, not one per reconcile.
        if (old_ready.get("reason"), old_ready.get("message")) != (new_ready.get("reason"), new_ready.get("message")):
            meta = self.body["metadata"]
            log.warning("%s/%s: %s", meta["namespace"], meta["name"], message)
            self.api.event(self.body, "Warning", reason, message)
        self.outcome.result = _RESULTS.get(reason, "invalid")
        self.write(new_status)

    def refused_by_admission(self, svc: spec.ServiceSpec, message: str) -> None:
        """Another admission controller of the cluster refused a child: said as a refusal, then tried
        again with back-off (``Outcome.retry``), as it may let the change through later."""
        self.refused(svc, message, reason=reasons.CHILD_REFUSED_BY_ADMISSION)
        self.outcome.retry = True

    def conflict(self, svc: spec.ServiceSpec, taken: list[tuple[str, str]]) -> None:
        what = ", ".join(f"{kind} {child}" for kind, child in taken)
        namespace = self.body["metadata"]["namespace"]
        message = (
            f"{what} already exist(s) in namespace {namespace} and do(es) not belong to this TFDataService; "
            "nothing was changed. Delete or rename them, or give this TFDataService another name."
        )
        self.refused(svc, message, reason=reasons.NAME_CONFLICT)

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


# The reconcile's result (the reconciles metric) of a refusal, by its reason; any other: "invalid".
_RESULTS = {reasons.NAME_CONFLICT: "conflict", reasons.CHILD_REFUSED_BY_ADMISSION: "refused"}


def _ready_condition(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == reasons.READY), {})


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


# How long a read of a Node, claim or volume is kept: a lost node is acted on at most this late,
# and the pods of one node (or a burst of their events) cost one read.
NODE_READ_SECONDS = 5.0


def _read(
    api: Api, readers: Readers | None, api_version: str, kind: str, namespace: str | None, name: str
) -> Manifest | None:
    """An object the watches do not cover (None: it does not exist), kept for NODE_READ_SECONDS."""
    if readers is None:
        return api.get(api_version, kind, namespace, name)
    key = (kind, namespace, name)
    return readers.nodes.get(
        key, lambda: api.get(api_version, kind, namespace, name), readers.clock(), NODE_READ_SECONDS
    )


def _replace_pod(run: Run, pod: Manifest, reason: str, why: str) -> None:
    meta = pod["metadata"]
    if run.api.delete("v1", "Pod", meta["namespace"], meta["name"], uid=meta.get("uid")):
        run.record(reason, f"Deleted pod {meta['name']}: {why}")
        run.outcome.result = "changed"


def _explain(
    api: Api,
    config: OperatorConfig,
    sts: Manifest | None,
    pods: list[Manifest],
    health_port: int,
    readers: Readers | None,
) -> Finding | None:
    """Why a StatefulSet does not serve (``diagnose.py``): nothing is read for one that is settled,
    Events only for pods it could not create or claims that are not bound, and one server's
    ``/readyz`` only when its pod runs but is not ready and nothing else explains it.

    Events are read for a whole namespace and kind at once (``Api.list_events``), and each read is
    kept for a resync (``readers``): every event of an unready service's pods queues a reconcile,
    and each would otherwise read again what it read a moment ago. So unready services cost at most
    one list of Events per namespace and kind (StatefulSet, PersistentVolumeClaim) per resync, and
    one ``/readyz`` per unready server; the status written from them changes only when their answer
    does."""
    if sts is None or scaling.statefulset_settled(sts):
        return None
    namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
    ttl, now = config.resync_seconds, readers.clock() if readers is not None else 0.0

    def events(kind: str, involved: str) -> list[Manifest]:
        def read() -> list[Manifest]:
            return [cache.trim_event(e) for e in api.list_events(namespace, kind)]

        listed = read() if readers is None else readers.events.get((namespace, kind), read, now, ttl)
        return [e for e in listed if e["involvedObject"].get("name") == involved]

    sts_events = events("StatefulSet", name) if needs_events(sts, pods) else []
    claims = {c: events("PersistentVolumeClaim", c) for c in claims_to_read(sts, pods)}
    found = explain(sts, pods, sts_events, claims)
    if found is None and readers is not None and (pod := unready_server(sts, pods)) is not None:
        detail = readiness(readers, pod, health_port, ttl)
        found = from_readiness(pod, detail) if detail else None
    return found
