"""The TFDataService's ``status``: computed from the observed children, never remembered.

Conditions follow ``metav1.Condition``; ``Ready`` is the summary of ``DispatcherReady``
and ``WorkersReady``. ``lastTransitionTime`` changes only when a condition's status flips,
so recomputing an unchanged status gives an identical one and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import builders, scaling
from .builders import BuildSettings
from .diagnose import Finding
from .spec import ServiceSpec

READY = "Ready"
DISPATCHER_READY = "DispatcherReady"
WORKERS_READY = "WorkersReady"
CONDITION_TYPES = (READY, DISPATCHER_READY, WORKERS_READY)
INVALID_SPEC = "InvalidSpec"
NAME_CONFLICT = "NameConflict"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """The live children the status is computed from."""

    dispatcher: Manifest | None
    workers: Manifest | None
    # Why each StatefulSet does not serve (diagnose.explain), when the reconcile looked.
    dispatcher_problem: Finding | None = None
    workers_problem: Finding | None = None


def dispatcher_condition(observed: Observed) -> Condition:
    sts = observed.dispatcher
    if sts is None:
        return Condition(DISPATCHER_READY, False, "DispatcherMissing", "The dispatcher StatefulSet does not exist yet.")
    status = sts.get("status") or {}
    if scaling.statefulset_settled(sts):
        return Condition(DISPATCHER_READY, True, "DispatcherReady", "The dispatcher serves requests.")
    if status.get("currentRevision") != status.get("updateRevision") or status.get("updatedReplicas", 0) < 1:
        return Condition(
            DISPATCHER_READY, False, "DispatcherRestarting", "The dispatcher is restarting with a new configuration."
        )
    return Condition(
        DISPATCHER_READY,
        False,
        "DispatcherNotReady",
        "The dispatcher pod is not ready yet (starting, replaying its journal, or unable to run: "
        "see `kubectl describe pod` of the dispatcher).",
    )


def workers_condition(svc: ServiceSpec, observed: Observed, waiting: str | None) -> Condition:
    desired = svc.workers.replicas
    sts = observed.workers
    ready = int(((sts or {}).get("status") or {}).get("readyReplicas", 0))
    if waiting:
        return Condition(WORKERS_READY, False, "Scaling", waiting)
    if sts is None:
        return Condition(WORKERS_READY, False, "WorkersMissing", "The worker StatefulSet does not exist yet.")
    if sts.get("spec", {}).get("replicas") == desired and scaling.statefulset_settled(sts):
        return Condition(WORKERS_READY, True, "WorkersReady", f"{ready}/{desired} workers are ready.")
    return Condition(WORKERS_READY, False, "WorkersNotReady", f"{ready}/{desired} workers are ready and up to date.")


# Conditions a diagnosis may explain: a StatefulSet that exists and is not ready (not one that is
# missing, or held back on purpose while the dispatcher restarts).
_EXPLAINABLE = frozenset({"DispatcherNotReady", "DispatcherRestarting", "WorkersNotReady"})


def explained(condition: Condition, problem: Finding | None) -> Condition:
    """``condition`` with Kubernetes' own reason and message for why it is not ready, when known."""
    if problem is None or condition.status or condition.reason not in _EXPLAINABLE:
        return condition
    # The workers' message has the count; the dispatcher's generic guesses give way to the cause.
    what = "The dispatcher is not ready" if condition.type == DISPATCHER_READY else condition.message.rstrip(".")
    return Condition(condition.type, False, problem.reason, f"{what}: {problem.message}")


def summary_condition(
    dispatcher: Condition, workers: Condition, invalid: str | None, reason: str = INVALID_SPEC
) -> Condition:
    if invalid is not None:
        return Condition(READY, False, reason, invalid)
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


def compute_status(
    svc: ServiceSpec | None,
    body: Mapping[str, Any],
    observed: Observed,
    settings: BuildSettings,
    now: str,
    invalid: str | None = None,
    waiting: str | None = None,
    reason: str = INVALID_SPEC,
) -> dict[str, Any]:
    """The whole status. ``svc`` is None when the spec is invalid and cannot be parsed at all."""
    old = body.get("status") or {}
    generation = int(body.get("metadata", {}).get("generation", 0))
    dispatcher = explained(dispatcher_condition(observed), observed.dispatcher_problem)
    if svc is not None:
        workers = explained(workers_condition(svc, observed, waiting), observed.workers_problem)
    else:
        workers = Condition(WORKERS_READY, False, INVALID_SPEC, "The spec is invalid; see the Ready condition.")
    ready = summary_condition(dispatcher, workers, invalid, reason)

    worker_status = (observed.workers or {}).get("status") or {}
    desired = svc.workers.replicas if svc else int(body.get("spec", {}).get("workers", {}).get("replicas", 0))
    ready_replicas = int(worker_status.get("readyReplicas", 0))
    live_list = scaling.live_worker_list(builders.read_config(observed.dispatcher))
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(old.get("conditions"), [ready, dispatcher, workers], generation, now),
        "workers": {
            "replicas": int(worker_status.get("replicas", 0)),
            "readyReplicas": ready_replicas,
            "summary": f"{ready_replicas}/{desired}",
        },
        # None removes the field in a merge patch.
        "workerAddresses": live_list,
        "dispatcherAddress": builders.dispatcher_address(svc, settings) if svc else old.get("dispatcherAddress"),
        "selector": builders.worker_selector(svc) if svc else old.get("selector"),
    }
    return status


def status_differs(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether a merge patch of ``new`` over ``old`` would change anything (None means absent,
    and a key ``new`` leaves out stays as it is)."""
    return _differs(old or {}, new)


def _differs(old: Any, new: Any) -> bool:
    if isinstance(new, Mapping):
        return not isinstance(old, Mapping) or any(_differs(old.get(k), v) for k, v in new.items())
    return bool(old != new)
