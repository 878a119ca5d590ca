"""A TFDataService admitted through Kueue: what its Workload says, and what the service does about it.

A service labelled ``kueue.x-k8s.io/queue-name`` runs no pod until Kueue admits its Workload
(``render/workload.py``). The operator takes the owner's half of Kueue's protocol, the part
Kueue's own integrations do for a Job (``jobframework/reconciler.go`` in Kueue v0.19.2):

- **Queued**: the Workload is written; no pod. While it holds no quota, a spec edit rewrites it.
- **Admitted**: the pods start, with the admitted flavors' node labels and tolerations (and any
  admission check's pod set updates) merged into their templates, and at most the admitted
  worker count; the autoscaler's ceiling is that count. ``PodsReady`` on the Workload says whether
  the dispatcher and the workers are Ready, as Kueue's own integrations write it (False
  ``WaitForStart``, then True ``Started``; a pod lost after that: False ``WaitForRecovery``, then
  True ``Recovered``): Kueue's ``waitForPodsReady`` waits for it, and its ``recoveryTimeout``
  evicts a service that stays short of a pod.
- **Evicted** (preempted, its ClusterQueue stopped, deactivated...): every pod stops at once,
  readers or not (the preemptor waits for the quota); the Services, address and journal claim
  stay. Once no pod is left, the operator releases the quota as Kueue's integrations do: the
  admission cleared, ``QuotaReserved`` False, ``Requeued`` True after a preemption or a node
  failure. Admitted again, the same StatefulSets start on the same journal.
- **Requeueing**: an edit of what Kueue accounts (resources, placement, priority class) to an
  admitted service is carried out through the queue: the pods stop (a held suspend: readers
  first), the Workload is deleted, and a new one queues with the new pod sets.
- **Suspended** (spec.suspend, by hand or by spec.lifecycle): once no pod is left, the Workload
  is deleted, so the quota is back at once; a resume queues a new one.
- **Finished** by Kueue (it could not start it): nothing runs; suspend and resume to queue again.

Removing the label deletes the Workload: the service leaves the queue and runs as any other.
Pure functions: ``controller/kueue.py`` reads the Workload, flavors and priority class and
carries the decision out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfdata_operator.api import diff, kueue, reasons
from tfdata_operator.api.spec import RESCALE_IMMEDIATE, PodSettings, ServiceSpec
from tfdata_operator.render import builders

Manifest = dict[str, Any]

QUEUED, ADMITTING, ADMITTED, EVICTED, REQUEUEING, SUSPENDED, FINISHED, UNAVAILABLE = (
    "Queued",
    "Admitting",
    "Admitted",
    "Evicted",
    "Requeueing",
    "Suspended",
    "Finished",
    "Unavailable",
)
# The states in which no pod may run, each with the reason Ready then gives.
REASONS = {
    QUEUED: reasons.KUEUE_QUEUED,
    ADMITTING: reasons.KUEUE_QUEUED,
    EVICTED: reasons.KUEUE_EVICTED,
    REQUEUEING: reasons.KUEUE_REQUEUEING,
    FINISHED: reasons.KUEUE_FINISHED,
    UNAVAILABLE: reasons.KUEUE_UNAVAILABLE,
}
GATED = tuple(REASONS)

# The pod set of each component.
POD_SETS = {builders.DISPATCHER: kueue.DISPATCHER_POD_SET, builders.WORKER: kueue.WORKERS_POD_SET}
# What Kueue accounts or places by, in a pod set's template: an edit of one of these to an
# admitted service goes through the queue again.
_ACCOUNTED_POD_FIELDS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "runtimeClassName",
    "overhead",
    "topologySpreadConstraints",
)


@dataclass(frozen=True)
class Overlay:
    """What an admission adds to a component's pods: the flavors' node labels and tolerations."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Decision:
    # status.kueue.state (None: the service is not queued and nothing is left to undo).
    state: str | None = None
    message: str = ""
    # The Workload to write (server-side apply), or to delete (the live one's uid).
    apply: Manifest | None = None
    delete: str | None = None
    # A merge patch of the Workload's status (with its resourceVersion): the quota released after
    # an eviction, or PodsReady.
    status_patch: Manifest | None = None
    # The most workers that may run (the admitted count), and what the admission adds to the pods.
    ceiling: int | None = None
    overlays: Mapping[str, Overlay] = field(default_factory=dict)
    # Stop every pod at once, readers or not (an eviction: the quota is someone else's now).
    immediate: bool = False
    # status.kueue (None removes it).
    status: Manifest | None = None
    # (type, reason, message) Events, each on the change it reports.
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def gated(self) -> bool:
        return self.state in GATED

    def effective_spec(self, svc: ServiceSpec) -> ServiceSpec:
        """The spec the children are built with: suspended while gated, else with the admission's
        overlays and at most the admitted worker count (also the autoscaler's ceiling)."""
        if self.gated:
            policy = RESCALE_IMMEDIATE if self.immediate else svc.workers.rescale_policy
            return dataclasses.replace(
                svc, suspend=True, workers=dataclasses.replace(svc.workers, rescale_policy=policy)
            )
        if self.state != ADMITTED:
            return svc
        dispatcher = dataclasses.replace(
            svc.dispatcher, pod=_overlaid(svc.dispatcher.pod, self.overlays.get(builders.DISPATCHER))
        )
        workers = dataclasses.replace(svc.workers, pod=_overlaid(svc.workers.pod, self.overlays.get(builders.WORKER)))
        autoscaling = svc.autoscaling
        if self.ceiling is not None:
            workers = dataclasses.replace(workers, replicas=min(workers.replicas, self.ceiling))
            if autoscaling is not None:
                top = max(autoscaling.min_replicas, min(autoscaling.max_replicas, self.ceiling))
                autoscaling = dataclasses.replace(autoscaling, max_replicas=top)
        return dataclasses.replace(svc, dispatcher=dispatcher, workers=workers, autoscaling=autoscaling)


def _overlaid(pod: PodSettings, overlay: Overlay | None) -> PodSettings:
    if overlay is None:
        return pod
    extra = tuple(t for t in overlay.tolerations if t not in pod.tolerations)
    return dataclasses.replace(
        pod, node_selector={**pod.node_selector, **overlay.node_selector}, tolerations=(*pod.tolerations, *extra)
    )


def condition(workload: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for c in ((workload or {}).get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return dict(c)
    return None


def is_true(workload: Mapping[str, Any] | None, kind: str) -> bool:
    return (condition(workload, kind) or {}).get("status") == "True"


def admission(workload: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """status.admission: the ClusterQueue and each pod set's flavors and count (None: no quota held)."""
    found = ((workload or {}).get("status") or {}).get("admission")
    return found if isinstance(found, Mapping) else None


def admitted_count(workload: Mapping[str, Any] | None, pod_set: str) -> int | None:
    for assignment in (admission(workload) or {}).get("podSetAssignments") or []:
        if assignment.get("name") == pod_set and isinstance(assignment.get("count"), int):
            return int(assignment["count"])
    return None


def flavors_of(workload: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """The flavors each pod set was admitted with (pod set -> flavor names, in order)."""
    found: dict[str, list[str]] = {}
    for assignment in (admission(workload) or {}).get("podSetAssignments") or []:
        names = [str(f) for f in (assignment.get("flavors") or {}).values()]
        found[str(assignment.get("name"))] = list(dict.fromkeys(names))
    return found


def decide(
    svc: ServiceSpec,
    desired: Manifest | None,
    live: Manifest | None,
    pods: int,
    ready: bool,
    flavors: Mapping[str, Manifest | None],
    old: Mapping[str, Any] | None,
    now: str,
    problem: str | None = None,
) -> Decision:
    """What to do now. ``desired`` is the Workload as the spec renders it (None: not queued),
    ``live`` the service's Workload as watched, ``pods`` how many of its pods exist, ``ready``
    whether its dispatcher and the workers it runs are Ready, ``flavors`` the admitted
    ResourceFlavors by name (None: not found), ``old`` the last status.kueue, ``problem`` why the
    Workload cannot be written (its priority class unreadable, say)."""
    if svc.kueue is None or desired is None:
        if live is None:
            return Decision()
        message = (
            f"Not admitted through Kueue any more (no {kueue.QUEUE_LABEL} label): Workload "
            f"{_name(live)} deleted, its quota released; the service runs as any other."
        )
        return Decision(delete=_uid(live), events=[("Normal", reasons.KUEUE_LEFT, message)])
    name = desired["metadata"]["name"]
    draft = _Draft(svc, name, old, now)
    if svc.suspend:
        return _suspended(draft, live, pods)
    if problem is not None:
        return draft.done(UNAVAILABLE, problem, apply=None)
    if live is None:
        return draft.done(
            QUEUED, f"Waiting for Kueue: Workload {name} created in LocalQueue {svc.kueue.queue}.", desired
        )
    if is_true(live, kueue.FINISHED):
        why = _said(condition(live, kueue.FINISHED))
        return draft.done(
            FINISHED, f"Kueue finished Workload {name} ({why}); suspend and resume the service to queue it again."
        )
    if is_true(live, kueue.EVICTED):
        return _evicted(draft, live, pods)
    if is_true(live, kueue.ADMITTED) and admission(live) is not None:
        return _admitted(draft, desired, live, pods, ready, flavors)
    if admission(live) is not None:
        return draft.done(ADMITTING, f"Kueue reserved quota for Workload {name}; waiting for its admission checks.")
    said = _said(condition(live, kueue.QUOTA_RESERVED))
    waiting = f"Waiting for Kueue to admit Workload {name} (LocalQueue {svc.kueue.queue})" + (
        f": {said}" if said else "."
    )
    changed = _differs(desired, live)
    return draft.done(QUEUED, waiting, desired if changed else None)


class _Draft:
    """What every state shares: the status block, and an Event on a change of state."""

    def __init__(self, svc: ServiceSpec, name: str, old: Mapping[str, Any] | None, now: str) -> None:
        self.svc, self.name, self.old, self.now = svc, name, old or {}, now

    def done(self, state: str, message: str, apply: Manifest | None = None, **rest: Any) -> Decision:
        assert self.svc.kueue is not None
        status: Manifest = {
            "workload": self.name,
            "queue": self.svc.kueue.queue,
            "state": state,
            "since": self.old.get("since") if self.old.get("state") == state else self.now,
            "message": message,
            "clusterQueue": rest.pop("cluster_queue", None),
            "admittedWorkers": rest.pop("admitted_workers", None),
        }
        events = []
        if self.old.get("state") != state and state in _EVENTS:
            event_type, reason = _EVENTS[state]
            events.append((event_type, reason, message))
        return Decision(state=state, message=message, apply=apply, status=status, events=events, **rest)


_EVENTS = {
    QUEUED: ("Normal", reasons.KUEUE_QUEUED),
    ADMITTED: ("Normal", reasons.KUEUE_ADMITTED),
    EVICTED: ("Warning", reasons.KUEUE_EVICTED),
    REQUEUEING: ("Normal", reasons.KUEUE_REQUEUEING),
    FINISHED: ("Warning", reasons.KUEUE_FINISHED),
    UNAVAILABLE: ("Warning", reasons.KUEUE_UNAVAILABLE),
}


def _suspended(draft: _Draft, live: Manifest | None, pods: int) -> Decision:
    """spec.suspend: the Workload goes once the pods are gone (the quota back at once)."""
    if live is None:
        return draft.done(SUSPENDED, "Suspended: no Workload queued; a resume queues a new one.")
    if pods:
        return draft.done(SUSPENDED, f"Suspending: Workload {draft.name} is deleted once {pods} pod(s) have stopped.")
    return draft.done(SUSPENDED, f"Suspended: Workload {draft.name} deleted, its quota released.", delete=_uid(live))


def _evicted(draft: _Draft, live: Manifest, pods: int) -> Decision:
    evicted = condition(live, kueue.EVICTED) or {}
    why = _said(evicted)
    message = (
        f"Kueue evicted Workload {draft.name} ({why}): every pod stops; the Services, address and journal "
        "claim stay, and the service starts again on its journal when Kueue admits it again."
    )
    patch = None
    if admission(live) is not None:
        if pods:
            message += f" The quota is released once {pods} pod(s) have stopped."
        else:
            patch = release(live, draft.now)
    return draft.done(EVICTED, message, immediate=True, status_patch=patch)


def _admitted(
    draft: _Draft,
    desired: Manifest,
    live: Manifest,
    pods: int,
    ready: bool,
    flavors: Mapping[str, Manifest | None],
) -> Decision:
    svc, name = draft.svc, draft.name
    cluster_queue = str((admission(live) or {}).get("clusterQueue") or "")
    accounted = _accounted_change(desired, live)
    if accounted:
        message = (
            f"The spec changed what Kueue accounts for ({accounted}): the service goes through the queue again "
            f"(its pods stop, Workload {name} is deleted and a new one queued)."
        )
        return draft.done(REQUEUEING, message, delete=None if pods else _uid(live), cluster_queue=cluster_queue)
    overlays, missing = _overlays(live, flavors)
    if missing:
        message = f"Workload {name} was admitted with ResourceFlavor(s) {', '.join(missing)}, which cannot be read."
        return draft.done(UNAVAILABLE, message)
    ceiling = admitted_count(live, kueue.WORKERS_POD_SET)
    message = f"Admitted by Kueue in ClusterQueue {cluster_queue} (Workload {name})"
    wanted = svc.workers.replicas
    if ceiling is not None and wanted > ceiling:
        message += (
            f"; the spec wants {wanted} workers, Kueue admitted {ceiling}: {ceiling} run. Suspend and resume the "
            "service to queue for more"
        )
    patch = pods_ready(live, ready, draft.now)
    return draft.done(
        ADMITTED,
        message + ".",
        ceiling=ceiling,
        overlays=overlays,
        status_patch=patch,
        cluster_queue=cluster_queue,
        admitted_workers=ceiling,
    )


def _overlays(live: Manifest, flavors: Mapping[str, Manifest | None]) -> tuple[dict[str, Overlay], list[str]]:
    """Each component's overlay, as Kueue's ``podset.FromAssignment`` and ``Merge`` make it: the
    admitted flavors' nodeLabels and tolerations, then each admission check's pod set updates."""
    by_set = flavors_of(live)
    updates = [
        u for check in (live.get("status") or {}).get("admissionChecks") or [] for u in check.get("podSetUpdates") or []
    ]
    overlays, missing = {}, []
    for component, pod_set in POD_SETS.items():
        selector: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for flavor_name in by_set.get(pod_set, []):
            flavor = flavors.get(flavor_name)
            if flavor is None:
                missing.append(flavor_name)
                continue
            spec = flavor.get("spec") or {}
            selector.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
            tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        for update in (u for u in updates if u.get("name") == pod_set):
            selector.update({str(k): str(v) for k, v in (update.get("nodeSelector") or {}).items()})
            tolerations += [t for t in update.get("tolerations") or [] if t not in tolerations]
        overlays[component] = Overlay(selector, tuple(tolerations))
    return overlays, sorted(set(missing))


def _accounted_change(desired: Manifest, live: Manifest) -> str:
    """What differs between the pod sets Kueue admitted and the spec's, in what Kueue accounts
    for ("" when nothing): the containers' resources and the pods' placement. The worker count
    is not among them: it runs up to the admitted count."""
    found = []
    live_sets = {s.get("name"): s for s in (live.get("spec") or {}).get("podSets") or []}
    for wanted in desired["spec"]["podSets"]:
        have = live_sets.get(wanted["name"])
        if have is None:
            found.append(f"pod set {wanted['name']}")
            continue
        mine, theirs = wanted["template"]["spec"], (have.get("template") or {}).get("spec") or {}
        for key in ("containers", "initContainers"):
            if _resources(mine.get(key)) != _resources(theirs.get(key)):
                found.append(f"{wanted['name']} {key}' resources")
        found += [f"{wanted['name']} {k}" for k in _ACCOUNTED_POD_FIELDS if mine.get(k) != theirs.get(k)]
    return ", ".join(found)


def _resources(containers: Sequence[Mapping[str, Any]] | None) -> list[tuple[str, Any]]:
    return [(str(c.get("name")), c.get("resources") or {}) for c in containers or []]


def _differs(desired: Manifest, live: Manifest) -> bool:
    """Whether the Workload as the spec renders it differs from the live one in what the operator writes."""
    return diff.changes(live.get("spec"), desired.get("spec"), apply=True) or diff.changes(
        (live.get("metadata") or {}).get("labels"), (desired.get("metadata") or {}).get("labels"), apply=True
    )


def release(live: Manifest, now: str) -> Manifest:
    """The merge patch that gives the quota of an evicted Workload back, as Kueue's integrations do
    once their job stopped (``reconciler.go``, step 6): ``status.admission`` removed,
    ``QuotaReserved`` False (Pending), ``Admitted`` False (NoReservation), and ``Requeued`` True
    only after a preemption or a node failure. With the Workload's resourceVersion: a Workload
    changed meanwhile refuses it (409), and the next reconcile decides again."""
    evicted = condition(live, kueue.EVICTED) or {}
    reason, message = str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "")
    generation = (live.get("metadata") or {}).get("generation")
    conditions = list(((live.get("status") or {}).get("conditions")) or [])
    conditions = _set(conditions, kueue.REQUEUED, reason in kueue.REQUEUED_AFTER, reason, message, now, generation)
    conditions = _set(conditions, kueue.QUOTA_RESERVED, False, "Pending", message, now, generation)
    if condition(live, kueue.ADMITTED) is not None:
        conditions = _set(
            conditions, kueue.ADMITTED, False, "NoReservation", "The workload has no reservation", now, generation
        )
    return _patch(live, {"admission": None, "conditions": conditions})


# Kueue's PodsReady reasons and messages (``generatePodsReadyCondition`` in jobframework/reconciler.go).
PODS_READY_SAID = {
    kueue.WAIT_FOR_START: "Not all pods are ready or succeeded",
    kueue.WAIT_FOR_RECOVERY: "At least one pod has failed, waiting for recovery",
    kueue.STARTED: "All pods reached readiness and the workload is running",
    kueue.RECOVERED: "All pods reached readiness and the workload is running",
}


def pods_ready(live: Manifest, ready: bool, now: str) -> Manifest | None:
    """The merge patch that tells Kueue whether the admitted pods are Ready (``waitForPodsReady``),
    as Kueue's ``generatePodsReadyCondition`` decides it for its own integrations; None when the
    Workload already says so. Not Ready after having been: ``WaitForRecovery``, which Kueue's
    ``recoveryTimeout`` counts from."""
    before = condition(live, kueue.PODS_READY) or {}
    was_true, was = before.get("status") == "True", before.get("reason")
    if ready:
        reason = kueue.RECOVERED if was in (kueue.WAIT_FOR_RECOVERY, kueue.RECOVERED) else kueue.STARTED
    else:
        reason = kueue.WAIT_FOR_RECOVERY if was_true or was == kueue.WAIT_FOR_RECOVERY else kueue.WAIT_FOR_START
    if before and was_true == ready and was == reason:
        return None
    generation = (live.get("metadata") or {}).get("generation")
    conditions = list(((live.get("status") or {}).get("conditions")) or [])
    said = _set(conditions, kueue.PODS_READY, ready, reason, PODS_READY_SAID[reason], now, generation)
    return _patch(live, {"conditions": said})


def _patch(live: Manifest, status: Manifest) -> Manifest:
    return {"metadata": {"resourceVersion": (live.get("metadata") or {}).get("resourceVersion")}, "status": status}


def _set(
    conditions: list[Manifest], kind: str, status: bool, reason: str, message: str, now: str, generation: Any
) -> list[Manifest]:
    """``conditions`` with ``kind`` set, as apimachinery's SetStatusCondition does: its
    lastTransitionTime moves only when its status flips."""
    value = "True" if status else "False"
    before = next((c for c in conditions if c.get("type") == kind), None)
    new: Manifest = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": before["lastTransitionTime"]
        if before is not None and before.get("status") == value and before.get("lastTransitionTime")
        else now,
    }
    if isinstance(generation, int):
        new["observedGeneration"] = generation
    if before is None:
        return [*conditions, new]
    return [new if c is before else c for c in conditions]


def _said(c: Mapping[str, Any] | None) -> str:
    """A Kueue condition's reason and message, for ours."""
    if not c:
        return ""
    reason, message = str(c.get("reason") or ""), str(c.get("message") or "")
    return f"{reason}: {message}" if reason and message else reason or message


def _name(workload: Mapping[str, Any]) -> str:
    return str((workload.get("metadata") or {}).get("name"))


def _uid(workload: Mapping[str, Any]) -> str:
    return str((workload.get("metadata") or {}).get("uid") or "")
