"""The TFDataService's ``status``: computed from the observed children, never remembered.

Conditions follow ``metav1.Condition``; ``Ready`` is the summary of ``DispatcherReady``
and ``WorkersReady``. ``lastTransitionTime`` changes only when a condition's status flips,
so recomputing an unchanged status gives an identical one and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfdata_operator.api import diff, limits, reasons
from tfdata_operator.api.reasons import (
    DISPATCHER_READY,
    INVALID_SPEC,
    READY,
    RESCALE_HELD,
    SUSPEND_HELD,
    SUSPENDED,
    WORKERS_READY,
)
from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.plan import drain, hold, scaling
from tfdata_operator.plan.diagnose import Finding
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings
from tfdata_operator.wire.serverinfo import ServerInfo

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Servers:
    """The live children the status is computed from."""

    dispatcher: Manifest | None
    workers: Manifest | None
    # Why each StatefulSet does not serve (diagnose.explain), when the reconcile looked.
    dispatcher_problem: Finding | None = None
    workers_problem: Finding | None = None
    # What the ready dispatcher runs (its /serverinfo), once read; None keeps the last one reported.
    server_info: ServerInfo | None = None
    # The pod it was read from, "<name>/<uid>": the status says which pod it describes.
    server_pod: str | None = None

    def pods(self) -> int:
        """Pods of either StatefulSet that still exist (stopping ones included)."""
        return sum(int(((sts or {}).get("status") or {}).get("replicas", 0)) for sts in (self.dispatcher, self.workers))


def dispatcher_condition(observed: Servers) -> Condition:
    sts = observed.dispatcher
    if sts is None:
        return Condition(
            DISPATCHER_READY, False, reasons.DISPATCHER_MISSING, "The dispatcher StatefulSet does not exist yet."
        )
    status = sts.get("status") or {}
    if scaling.statefulset_settled(sts):
        return Condition(DISPATCHER_READY, True, reasons.DISPATCHER_SERVING, "The dispatcher serves requests.")
    if status.get("currentRevision") != status.get("updateRevision") or status.get("updatedReplicas", 0) < 1:
        return Condition(
            DISPATCHER_READY,
            False,
            reasons.DISPATCHER_RESTARTING,
            "The dispatcher is restarting with a new configuration.",
        )
    return Condition(
        DISPATCHER_READY,
        False,
        reasons.DISPATCHER_NOT_READY,
        "The dispatcher pod is not ready yet (starting, replaying its journal, or unable to run: "
        "see `kubectl describe pod` of the dispatcher).",
    )


_SCALED_TO_ZERO = (
    "No worker runs: no client has read for the autoscaler's window (spec.autoscaling.minReplicas 0). "
    "The first client to read brings a worker and waits for it."
)


def workers_condition(svc: ServiceSpec, observed: Servers, waiting: str | None) -> Condition:
    desired = svc.workers.replicas
    sts = observed.workers
    ready = int(((sts or {}).get("status") or {}).get("readyReplicas", 0))
    if waiting:
        return Condition(WORKERS_READY, False, "Scaling", waiting)
    if sts is None:
        return Condition(WORKERS_READY, False, reasons.WORKERS_MISSING, "The worker StatefulSet does not exist yet.")
    if sts.get("spec", {}).get("replicas") == desired and scaling.statefulset_settled(sts):
        if desired == 0:
            return Condition(WORKERS_READY, True, reasons.SCALED_TO_ZERO, _SCALED_TO_ZERO)
        return Condition(WORKERS_READY, True, reasons.WORKERS_SERVING, f"{ready}/{desired} workers are ready.")
    return Condition(
        WORKERS_READY, False, reasons.WORKERS_NOT_READY, f"{ready}/{desired} workers are ready and up to date."
    )


# Conditions a diagnosis may explain: a StatefulSet that exists and is not ready (not one that is
# missing, or held back on purpose while the dispatcher restarts).
_EXPLAINABLE = frozenset({reasons.DISPATCHER_NOT_READY, reasons.DISPATCHER_RESTARTING, reasons.WORKERS_NOT_READY})


# Findings that hold even while the StatefulSet still counts the pod ready: the node lifecycle
# controller marks a lost node's pods not ready before the StatefulSet controller counts again, and
# the dispatcher on it serves nobody from the moment the node is unreachable; nor does a worker kept
# there while a snapshot is written.
_OVERRIDING = frozenset({reasons.DISPATCHER_NODE_LOST, reasons.KEPT_FOR_SNAPSHOT})


def explained(condition: Condition, problem: Finding | None) -> Condition:
    """``condition`` with Kubernetes' own reason and message for why it is not ready, when known."""
    overriding = problem is not None and problem.reason in _OVERRIDING
    if problem is None or (not overriding and (condition.status or condition.reason not in _EXPLAINABLE)):
        return condition
    # The workers' message has the count; the dispatcher's generic guesses give way to the cause.
    what = "The dispatcher is not ready" if condition.type == DISPATCHER_READY else condition.message.rstrip(".")
    return Condition(condition.type, False, problem.reason, f"{what}: {problem.message}")


def summary_condition(
    dispatcher: Condition, workers: Condition, invalid: str | None, reason: str = INVALID_SPEC
) -> Condition:
    if invalid is not None:
        return Condition(READY, False, reason, invalid)
    if dispatcher.status and workers.reason == reasons.SCALED_TO_ZERO:
        return Condition(READY, True, reasons.SCALED_TO_ZERO, f"The dispatcher serves. {workers.message}")
    if dispatcher.status and workers.status:
        return Condition(READY, True, "Ready", "The tf.data service is ready: the dispatcher and all workers serve.")
    failing = dispatcher if not dispatcher.status else workers
    return Condition(READY, False, failing.reason, failing.message)


def merge_conditions(
    old: list[Mapping[str, Any]] | None, new: list[Condition], generation: int, now: str
) -> list[dict[str, Any]]:
    """The full conditions list; lastTransitionTime is kept unless the status flips."""
    previous = {c.get("type"): c for c in old or []}
    merged = []
    for cond in new:
        status = "True" if cond.status else "False"
        before = previous.get(cond.type)
        changed = before is None or before.get("status") != status
        merged.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "observedGeneration": generation,
                "lastTransitionTime": now if changed else before.get("lastTransitionTime", now),  # type: ignore[union-attr]
            }
        )
    return merged


def suspended_condition(svc: ServiceSpec, observed: Servers, held: hold.HoldDecision | None, address: str) -> Condition:
    if held is not None:
        return Condition(SUSPENDED, False, SUSPEND_HELD, held.message)
    if not svc.suspend:
        return Condition(SUSPENDED, False, reasons.RESUMED, "The service was resumed: spec.suspend is false.")
    pods = observed.pods()
    now = f"{pods} pod(s) are still stopping" if pods else "no pod runs"
    return Condition(
        SUSPENDED,
        True,
        SUSPENDED,
        f"The service is suspended: {now}. Its Services, address ({address}), journal claim and configuration "
        "stay; set spec.suspend: false to resume it.",
    )


def compute_status(
    svc: ServiceSpec | None,
    body: Mapping[str, Any],
    observed: Servers,
    settings: BuildSettings,
    now: str,
    invalid: str | None = None,
    waiting: str | None = None,
    reason: str = INVALID_SPEC,
    decision: hold.HoldDecision | None = None,
    drains: drain.DrainDecision | None = None,
    queued: Condition | None = None,
) -> dict[str, Any]:
    """The whole status. ``svc`` is None when the spec is invalid and cannot be parsed at all.

    ``queued`` is why Kueue lets no pod run (``plan.kueue``): it is then ``Ready``'s reason and message.

    ``decision`` is the hold decision of this reconcile: a held change shows in ``held``, in
    ``WorkersReady`` (a rescale) or ``Suspended`` (a suspend), and so in ``Ready``. ``drains`` is
    the workers' disruption budget: while readers hold it, it shows in ``drains`` and, when drains
    wait, in ``WorkersReady``'s message.
    """
    old = body.get("status") or {}
    generation = int(body.get("metadata", {}).get("generation", 0))
    held = decision if decision is not None and decision.action == hold.HOLD and decision.pending else None
    address = builders.dispatcher_address(svc, settings) if svc else old.get("dispatcherAddress")
    conditions = _conditions(svc, old, observed, held, drains, str(address), invalid, waiting, reason)
    if queued is not None and invalid is None:
        conditions = _queued(conditions, queued)
    worker_status = (observed.workers or {}).get("status") or {}
    desired = svc.workers.replicas if svc else int(body.get("spec", {}).get("workers", {}).get("replicas", 0))
    ready_replicas = int(worker_status.get("readyReplicas", 0))
    live_list = scaling.live_worker_list(builders.read_config(observed.dispatcher))
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(old.get("conditions"), conditions, generation, now),
        "workers": {
            "replicas": int(worker_status.get("replicas", 0)),
            "readyReplicas": ready_replicas,
            "summary": f"{ready_replicas}/{desired}",
            "desired": desired,
            "current": int((observed.workers or {}).get("spec", {}).get("replicas", 0)),
        },
        # None removes the field in a merge patch.
        "workerAddresses": live_list,
        "dispatcherAddress": address,
        "selector": builders.worker_selector(svc) if svc else old.get("selector"),
        "held": _held_status(held, old, now),
        "drains": _drains_status(drains, old, now),
        "server": server_status(observed.server_info, observed.server_pod)
        if observed.server_info
        else old.get("server"),
    }
    # Text from the pods and from Kubernetes is in there: cut to the CRD, or the API server refuses all of it.
    return limits.fit(status, limits.SERVICE_STATUS)


def _conditions(
    svc: ServiceSpec | None,
    old: Mapping[str, Any],
    observed: Servers,
    held: hold.HoldDecision | None,
    drains: drain.DrainDecision | None,
    address: str,
    invalid: str | None,
    waiting: str | None,
    reason: str,
) -> list[Condition]:
    """Ready, DispatcherReady, WorkersReady and (once the service was ever suspended) Suspended:
    a held rescale or suspend and the drains that wait show in them."""
    held_suspend = held if held is not None and held.pending is not None and held.pending.is_suspend else None
    dispatcher = explained(dispatcher_condition(observed), observed.dispatcher_problem)
    if svc is not None:
        workers = explained(workers_condition(svc, observed, waiting), observed.workers_problem)
        if held is not None and held_suspend is None:
            workers = Condition(WORKERS_READY, False, RESCALE_HELD, held.message)
        elif drains is not None and drains.max_unavailable == 0 and workers.reason == reasons.WORKERS_SERVING:
            workers = Condition(WORKERS_READY, True, workers.reason, f"{workers.message} {drains.message}")
    else:
        workers = Condition(WORKERS_READY, False, INVALID_SPEC, "The spec is invalid; see the Ready condition.")
    suspended: Condition | None = None
    if svc is not None and (svc.suspend or any(c.get("type") == SUSPENDED for c in old.get("conditions") or [])):
        suspended = suspended_condition(svc, observed, held_suspend, address)
    if suspended is not None and suspended.status:
        dispatcher = Condition(DISPATCHER_READY, False, SUSPENDED, "The service is suspended: no dispatcher runs.")
        workers = Condition(WORKERS_READY, False, SUSPENDED, "The service is suspended: no worker runs.")
        ready = Condition(READY, False, SUSPENDED, suspended.message)
    elif held_suspend is not None and invalid is None:
        ready = Condition(READY, False, SUSPEND_HELD, held_suspend.message)
    else:
        ready = summary_condition(dispatcher, workers, invalid, reason)
    return [ready, dispatcher, workers] + ([suspended] if suspended is not None else [])


def _queued(conditions: list[Condition], queued: Condition) -> list[Condition]:
    """The conditions while Kueue lets no pod run: Ready says why, and so do the servers' conditions."""
    said = {
        READY: queued,
        DISPATCHER_READY: Condition(
            DISPATCHER_READY, False, queued.reason, "Not admitted by Kueue: no dispatcher runs."
        ),
        WORKERS_READY: Condition(WORKERS_READY, False, queued.reason, "Not admitted by Kueue: no worker runs."),
    }
    return [said.get(c.type, c) for c in conditions]


def _held_status(held: hold.HoldDecision | None, old: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """status.held: the change a hold keeps back, and since when (None: nothing is held)."""
    if held is None or held.pending is None:
        return None
    since = (old.get("held") or {}).get("since") or now
    return {"change": held.pending.change, "since": since, "message": held.message}


def _drains_status(drains: drain.DrainDecision | None, old: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """status.drains: while drains wait for the readers, since when (None: none waits)."""
    if drains is None or not drains.waiting:
        return None
    since = (old.get("drains") or {}).get("since") or now
    unreadable = ((old.get("drains") or {}).get("unreadableSince") or now) if drains.unreadable else None
    return {
        "maxUnavailable": drains.max_unavailable,
        "since": since,
        "unreadableSince": unreadable,
        "message": drains.message,
    }


# status.server lists at most this many of the ops the preloads registered (its opCount counts all).
MAX_LISTED_OPS = 64


def server_status(info: ServerInfo, pod: str | None) -> dict[str, Any]:
    """What the servers run, as the dispatcher reports it: for `kubectl get -o wide` and for users
    matching a trainer's TensorFlow against it (the whole op list stays at the dispatcher's /serverinfo)."""
    return {
        "tensorflowVersion": info.tensorflow_version,
        "pythonVersion": info.python_version,
        "graphDefVersion": info.graph_def.producer,
        "preloaded": list(info.preloaded),
        "opCount": len(info.ops),
        "preloadedOps": list(info.preloaded_ops[:MAX_LISTED_OPS]),
        "pod": pod,
    }


def status_differs(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether a merge patch of ``new`` over ``old`` would change anything (None means absent,
    and a key ``new`` leaves out stays as it is)."""
    return diff.changes(old or {}, new)
