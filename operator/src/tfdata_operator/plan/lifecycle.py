"""``spec.lifecycle``: the service ends or sleeps with the workload it feeds, or when nobody reads.

Three rules, each optional (RayJob's ``shutdownAfterJobFinishes`` / ``ttlSecondsAfterFinished``
are the model):

- ``afterWorkloadFinishes``: ``afterSeconds`` after the named workload (a batch/v1 Job, a JobSet,
  or any object with a finished-style condition) finishes, suspend or delete the service. Carried
  out once per workload (its uid): a service resumed by hand afterwards stays resumed.
- ``deleteWithWorkload``: an ownerReference from the service to the workload, so that Kubernetes'
  garbage collector deletes the service when the workload is deleted (no blockOwnerDeletion: the
  workload's deletion never waits for the service, and setting it needs no extra permission).
- ``idle.suspendAfterSeconds``: suspend once no client has read for that long, by the
  dispatcher's "is any client reading?" signal (the one the holds and scale to zero read). An
  unknown answer never suspends.

A workload that cannot be found or read is said in the status and a Warning Event; nothing is
suspended or deleted for it. Pure functions: the reconcile step (``controller/lifecycle.py``,
``follow_lifecycle``) reads the workload and the signal and carries out the decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tfdata_operator.api import coretypes, reasons
from tfdata_operator.api.spec import LIFECYCLE_DELETE, LIFECYCLE_SUSPEND, ServiceSpec, WorkloadRef
from tfdata_operator.wire.signals import ServiceSignals

Manifest = dict[str, Any]

# A workload has finished when one of these conditions is True: batch/v1 Job (Complete, Failed),
# JobSet (Completed, Failed), and the Succeeded/Finished spellings other controllers use.
# Interim ones (a Job's SuccessCriteriaMet, FailureTarget) are not: the Job still has pods.
FINISHED_CONDITIONS = ("Complete", "Completed", "Succeeded", "Failed", "Finished")
# How often a running workload is read again (a GET; no watch of arbitrary kinds).
WORKLOAD_RECHECK_SECONDS = 10.0

RUNNING, FINISHED, NOT_FOUND, UNREADABLE = "Running", "Finished", "NotFound", "Unreadable"
# Why an action is planned (status.lifecycle.nextAction.why).
WHY_FINISHED, WHY_IDLE = "WorkloadFinished", "Idle"


@dataclass(frozen=True)
class Unreadable:
    """The workload could not be read; ``why`` says what the API server answered."""

    why: str


@dataclass(frozen=True)
class Decision:
    # Suspend or Delete now (None: nothing to do now).
    action: str | None = None
    message: str = ""
    # The service's new metadata.ownerReferences (None: unchanged).
    owner_references: list[Manifest] | None = None
    # status.lifecycle (None: absent).
    status: Manifest | None = None
    # (type, reason, message) Events, each said once (on the change that it reports).
    events: list[tuple[str, str, str]] = field(default_factory=list)
    requeue_after: float | None = None


def finished(workload: Mapping[str, Any]) -> tuple[str, datetime | None] | None:
    """The condition type that says the workload finished, and when; None while it runs."""
    for c in (workload.get("status") or {}).get("conditions") or []:
        if c.get("type") in FINISHED_CONDITIONS and c.get("status") == "True":
            return str(c["type"]), coretypes.parse_time(c.get("lastTransitionTime"))
    return None


def needs_signal(svc: ServiceSpec, dispatcher_running: bool, old: Mapping[str, Any] | None, now: datetime) -> bool:
    """Whether the idle rule needs the dispatcher's signal now: when no read is on record, or the
    planned idle suspend is due (one read per ``suspendAfterSeconds`` at most)."""
    if svc.lifecycle.idle is None or svc.suspend or not dispatcher_running:
        return False
    planned = (old or {}).get("nextAction") or {}
    at = coretypes.parse_time(planned.get("at")) if planned.get("why") == WHY_IDLE else None
    return at is None or now >= at


def _time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _reference(ref: WorkloadRef) -> str:
    return f"{ref.kind} {ref.name}"


def owner_references(
    current: Sequence[Mapping[str, Any]], workload: Mapping[str, Any] | None, want: bool, old_uid: str | None
) -> list[Manifest] | None:
    """The service's ownerReferences with the workload's (``want``) or without the one the operator
    set before (``old_uid``); None when they are right already."""
    refs = [dict(r) for r in current]
    uid = (workload or {}).get("metadata", {}).get("uid")
    kept = [r for r in refs if r.get("uid") != old_uid or (want and r.get("uid") == uid)]
    if want and workload is not None and uid and not any(r.get("uid") == uid for r in kept):
        kept.append(
            {
                "apiVersion": workload["apiVersion"],
                "kind": workload["kind"],
                "name": workload["metadata"]["name"],
                "uid": uid,
            }
        )
    return None if kept == refs else kept


@dataclass
class _Draft:
    """What ``decide`` has found so far: each rule adds to it in turn."""

    status: Manifest = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    action: tuple[str, str, str] | None = None  # (what, why, message) due now
    planned: tuple[str, str, datetime] | None = None  # (what, why, at) later
    requeue: float | None = None
    refs: list[Manifest] | None = None


def decide(
    svc: ServiceSpec,
    workload: Manifest | Unreadable | None,
    current_refs: Sequence[Mapping[str, Any]],
    old: Mapping[str, Any] | None,
    signal: ServiceSignals | str | None,
    now: datetime,
) -> Decision:
    """What ``spec.lifecycle`` asks for now. ``workload`` is what a read of ``spec.lifecycle.workload``
    gave (None: not found; not read when no workload is named); ``old`` is status.lifecycle;
    ``signal`` the dispatcher's answer when ``needs_signal`` asked for it (a str: why it could not be
    read), else None."""
    life, old = svc.lifecycle, old or {}
    old_workload = old.get("workload") or {}
    draft = _Draft()
    if life.workload is not None:
        draft.status["workload"] = _follow_workload(
            draft, svc, life.workload, workload, current_refs, old_workload, now
        )
    elif old_workload.get("uid"):
        draft.refs = owner_references(current_refs, None, False, old_workload.get("uid"))
    if life.idle is not None:
        _follow_idle(draft, svc, life.idle.suspend_after_seconds, old, signal, now)
    return _conclude(draft, svc, now)


def _follow_workload(
    draft: _Draft,
    svc: ServiceSpec,
    ref: WorkloadRef,
    workload: Manifest | Unreadable | None,
    current_refs: Sequence[Mapping[str, Any]],
    old_workload: Mapping[str, Any],
    now: datetime,
) -> Manifest:
    """The afterWorkloadFinishes and deleteWithWorkload rules: status.lifecycle.workload."""
    life, what = svc.lifecycle, _reference(ref)
    seen: Manifest = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name}
    if isinstance(workload, Unreadable):
        seen |= {"state": UNREADABLE, "message": workload.why[:1024]}
        if old_workload.get("state") != UNREADABLE:
            draft.events.append(("Warning", reasons.WORKLOAD_UNREADABLE, f"Cannot read {what}: {workload.why}"))
        draft.requeue = WORKLOAD_RECHECK_SECONDS
    elif workload is None:
        seen |= {"state": NOT_FOUND, "message": f"No {what} in namespace {svc.namespace}: nothing is done."}
        if old_workload.get("state") != NOT_FOUND:
            message = f"{what} does not exist in namespace {svc.namespace}: spec.lifecycle does nothing until it does"
            draft.events.append(("Warning", reasons.WORKLOAD_NOT_FOUND, message))
        draft.requeue = WORKLOAD_RECHECK_SECONDS
    else:
        uid = str(workload["metadata"].get("uid", ""))
        draft.refs = owner_references(current_refs, workload, life.delete_with_workload, old_workload.get("uid"))
        seen["uid"] = uid
        done = finished(workload)
        if done is None:
            seen["state"] = RUNNING
            if life.after_workload_finishes is not None:
                draft.requeue = WORKLOAD_RECHECK_SECONDS
        else:
            _finished_workload(draft, svc, what, seen, done, old_workload, old_workload.get("uid") == uid, now)
    return seen


def _finished_workload(
    draft: _Draft,
    svc: ServiceSpec,
    what: str,
    seen: Manifest,
    done: tuple[str, datetime | None],
    old_workload: Mapping[str, Any],
    same: bool,
    now: datetime,
) -> None:
    """The workload has finished: act once ``afterSeconds`` have passed (once per workload uid,
    ``same`` when it is the one on record), else plan to."""
    kind, when = done
    at = when or (coretypes.parse_time(old_workload.get("finishedAt")) if same else None) or now
    seen |= {"state": FINISHED, "condition": kind, "finishedAt": _time(at)}
    acted = old_workload.get("actedAt") if same else None
    if acted:
        seen["actedAt"] = acted
    elif (after := svc.lifecycle.after_workload_finishes) is not None:
        due = at + timedelta(seconds=after.after_seconds)
        verb = "suspended" if after.action == LIFECYCLE_SUSPEND else "deleted"
        if now >= due:
            message = (
                f"{what} finished ({kind}) at {_time(at)}: the service is {verb} "
                f"(spec.lifecycle.afterWorkloadFinishes, afterSeconds {after.after_seconds})"
            )
            draft.action = (after.action, WHY_FINISHED, message)
            seen["actedAt"] = _time(now)
        else:
            draft.planned = (after.action, WHY_FINISHED, due)
            draft.requeue = (due - now).total_seconds()
            if not (same and old_workload.get("state") == FINISHED):
                message = f"{what} finished ({kind}): the service will be {verb} at {_time(due)}"
                draft.events.append(("Normal", reasons.WORKLOAD_FINISHED, message))


def _follow_idle(
    draft: _Draft,
    svc: ServiceSpec,
    idle: int,
    old: Mapping[str, Any],
    signal: ServiceSignals | str | None,
    now: datetime,
) -> None:
    """The idle rule (suspend after ``idle`` seconds): when the last read was, and a suspend due now
    or planned."""
    status = draft.status
    last = coretypes.parse_time(old.get("lastReadTime"))
    if isinstance(signal, ServiceSignals):
        read = now if signal.reading else now - timedelta(seconds=signal.idle_seconds)
        last = read if last is None else max(last, read)
    if last is not None:
        status["lastReadTime"] = _time(last)
        status["secondsSinceLastRead"] = max(0, int((now - last).total_seconds()))
    if isinstance(signal, str):
        status["readError"] = signal[:1024]
    if not svc.suspend and last is not None and signal is not None and not isinstance(signal, str):
        due = last + timedelta(seconds=idle)
        if now >= due:
            message = (
                f"No client has read for {status['secondsSinceLastRead']} s: the service is suspended "
                f"(spec.lifecycle.idle.suspendAfterSeconds {idle}); set spec.suspend: false to resume it"
            )
            draft.action = draft.action or (LIFECYCLE_SUSPEND, WHY_IDLE, message)
        elif draft.planned is None or due < draft.planned[2]:
            draft.planned = (LIFECYCLE_SUSPEND, WHY_IDLE, due)
    elif signal is None and not svc.suspend and (keep := old.get("nextAction") or {}).get("why") == WHY_IDLE:
        # Not read this time (not due yet, or no dispatcher runs): the plan stands while it lies
        # ahead; once due, the next read (when a dispatcher runs: its pod's events bring it) decides.
        kept_at = coretypes.parse_time(keep.get("at"))
        if kept_at is not None and kept_at > now and (draft.planned is None or kept_at < draft.planned[2]):
            draft.planned = (str(keep.get("action")), WHY_IDLE, kept_at)
    if isinstance(signal, str) and not svc.suspend:
        draft.requeue = _sooner(draft.requeue, WORKLOAD_RECHECK_SECONDS)


def _conclude(draft: _Draft, svc: ServiceSpec, now: datetime) -> Decision:
    """The action due now (none when the service is suspended already), else the one planned."""
    action, planned, status, requeue = draft.action, draft.planned, draft.status, draft.requeue
    if action is not None and action[0] == LIFECYCLE_SUSPEND and svc.suspend:
        action = None  # suspended already (by hand, or by the idle rule)
    if planned is not None and not (svc.suspend and planned[0] == LIFECYCLE_SUSPEND) and action is None:
        what_, why, at = planned
        status["nextAction"] = {"action": what_, "why": why, "at": _time(at)}
        requeue = _sooner(requeue, max(1.0, (at - now).total_seconds()))
    if action is not None:
        reason = reasons.LIFECYCLE_SUSPEND if action[0] == LIFECYCLE_SUSPEND else reasons.LIFECYCLE_DELETE
        draft.events.append(("Normal", reason, action[2]))
    return Decision(
        action=action[0] if action else None,
        message=action[2] if action else "",
        owner_references=draft.refs,
        status=status or None,
        events=draft.events,
        requeue_after=requeue,
    )


def _sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


__all__ = ["LIFECYCLE_DELETE", "LIFECYCLE_SUSPEND", "Decision", "Unreadable", "decide", "finished", "needs_signal"]
