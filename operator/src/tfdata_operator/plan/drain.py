"""The workers' PodDisruptionBudget: whether a drain (an eviction) may take a worker now.

A drain evicts a worker; its StatefulSet starts it again on another node at the same address.
Under a static sharding policy the restarted worker reads its shard again from the start, so a
job that reads at that moment gets that shard's elements twice, and says nothing. That is the
rule of the held rescale (``hold.py``) again: with ``rescalePolicy: WhenIdle`` (the default) the
budget is ``maxUnavailable: 0`` while the dispatcher's signal says a client reads (or cannot be
read: an unknown answer counts as reading), ``1`` once nobody has read for ``hold.QUIET_SECONDS``,
and ``1`` again after ``rescaleMaxWaitSeconds`` of waiting, on the same clock as a held change
(``hold.bound``). ``Immediate`` and DYNAMIC (a drain loses at most a worker's in-flight splits)
always allow one worker at a time; "OFF" has no budget (a replaced worker just starts over).

A snapshot being written holds drains too, where ``spec.snapshots`` is set: a drained worker comes
back at the same address and picks its stream up from its last checkpoint, but its committed
work since then is written again, and a worker that does not come back (its new pod cannot be
scheduled) stalls the snapshot for good. So the budget is ``0`` while the dispatcher's
``/v1/snapshots`` says one is ``IN_PROGRESS`` (or cannot be read), on the same clock, for any
sharding policy that has a budget. That costs one more GET per ``RECHECK_SECONDS`` for a service
with ``spec.snapshots`` whose workers run, even a settled one: a budget must be right before a
drain asks, not when it does.

What cannot be read ends a hold too, later: a dispatcher that never answers, or a journaled snapshot
path that became unreadable (a deleted bucket), would otherwise hold every drain of the workers'
nodes, and so node upgrades, for good. Drains held only by what cannot be read go ahead after
``spec.workers.drainUnreadableMaxWaitSeconds`` (an hour by default; counted from
``status.drains.unreadableSince``) with a Warning Event naming what could not be read.

Whoever installs the operator bounds every hold of a drain, whatever the services say: an operator
shared by many teams must not let one namespace's readers hold a node's drain, and so the cluster's
node upgrades, for as long as they keep reading. After ``--drain-max-wait-seconds``
(``CLUSTER_MAX_WAIT_SECONDS`` by default, the chart's ``drainMaxWaitSeconds``; 0: no bound), counted
from ``status.drains.since``, drains go ahead with a Warning Event, as after ``rescaleMaxWaitSeconds``.
A service's own ``rescaleMaxWaitSeconds`` may only be shorter.

Every budget lets an unready worker go (``unhealthyPodEvictionPolicy: AlwaysAllow``, in the
builder): it serves nobody, so it never blocks a drain.

Pure: the reconcile loop (``controller/decide.py``) reads the signal only when ``needs_signal`` says the
budget depends on it, and keeps a reading for ``valid_for`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from tfdata_operator.api import coretypes, reasons
from tfdata_operator.api.spec import RESCALE_IMMEDIATE, ServiceSpec
from tfdata_operator.plan import hold
from tfdata_operator.wire import snapshots as snapshotwire
from tfdata_operator.wire.signals import ServiceSignals

# How often the signal of a static WhenIdle service with running workers is read again: one GET
# to its dispatcher per 30 s (no API request, and no write while the budget stays). With the
# signal's own delay (up to ~12 s after a plain trainer's last element) and hold.QUIET_SECONDS,
# drains go ahead within a minute after the last reader stops, and wait within 30 s after one
# starts: a drain is a person's or an autoscaler's slow act, not a race the operator must win.
RECHECK_SECONDS = 30.0

# The cluster's bound on a held drain (the operator's option; 0 there: none). An hour, as the
# unreadable bound's default and as managed Kubernetes' node upgrades wait for a budget.
CLUSTER_MAX_WAIT_SECONDS = 3600
CLUSTER_MAX_WAIT_FLAG = "--drain-max-wait-seconds"


@dataclass(frozen=True)
class DrainDecision:
    """The workers' budget, and what the status and the Event say about it."""

    max_unavailable: int | None  # None: no PodDisruptionBudget ("OFF")
    # Why, for status.drains and WorkersReady while readers hold the budget ("" otherwise); it
    # stays the same while the budget does, so re-reading the signal writes nothing.
    message: str = ""
    # The details of this reading (who reads, how long nobody has), for the Event of a change.
    detail: str = ""
    # Readers hold drains, or did until rescaleMaxWaitSeconds let them go: status.drains keeps
    # when the wait started.
    waiting: bool = False
    forced: bool = False
    # What holds drains could not be read: status.drains keeps since when (drainUnreadableMaxWaitSeconds).
    unreadable: bool = False
    # Look again this soon even if nothing happens: rescaleMaxWaitSeconds ends the wait.
    requeue_after: float | None = None


def needs_signal(svc: ServiceSpec, running: bool, workers: int) -> bool:
    """Whether the budget depends on the signal: a static WhenIdle service whose dispatcher and workers run."""
    return svc.is_static and svc.workers.rescale_policy != RESCALE_IMMEDIATE and running and workers > 0


def needs_snapshots(svc: ServiceSpec, running: bool, workers: int) -> bool:
    """Whether the budget depends on the dispatcher's snapshots: a service with ``spec.snapshots`` and a
    budget, under WhenIdle, whose dispatcher and workers run."""
    return (
        svc.snapshots is not None
        and svc.sharding_policy != "OFF"
        and svc.workers.rescale_policy != RESCALE_IMMEDIATE
        and running
        and workers > 0
    )


def decide(
    svc: ServiceSpec,
    running: bool,
    workers: int,
    signal: hold.Signal | None,
    since: datetime | None,
    now: datetime,
    snapshots: hold.Snapshots | None = None,
    unreadable_since: datetime | None = None,
    cluster_max_wait: int | None = CLUSTER_MAX_WAIT_SECONDS,
) -> DrainDecision:
    """The budget. ``running``: a dispatcher pod runs; ``workers``: how many worker pods exist;
    ``signal``: what the dispatcher answered (read only when ``needs_signal``); ``since``: when
    readers or a snapshot started holding drains (status.drains), None if they do not;
    ``snapshots``: the dispatcher's ``/v1/snapshots`` (read only when ``needs_snapshots``);
    ``unreadable_since``: since when what holds drains could not be read (status.drains), None if it could;
    ``cluster_max_wait``: the operator's bound on any hold (``CLUSTER_MAX_WAIT_FLAG``; None: none)."""
    if svc.sharding_policy == "OFF":
        return DrainDecision(None)
    if needs_snapshots(svc, running, workers):
        saves = snapshots or hold.Unknown("the snapshots were not read")
        saving = hold.writing(svc, saves)
        if saving is not None:
            unread = Unreadable(_unreadable(saves), unreadable_since)
            return _held_by_snapshot(svc, saving, since, now, unread, cluster_max_wait)
    if not needs_signal(svc, running, workers):
        return DrainDecision(1, detail=_why_free(svc, running))
    if signal is None:
        signal = hold.Unknown("the signal was not read")
    if hold.idle(signal):
        assert isinstance(signal, ServiceSignals)
        return DrainDecision(1, detail=f"no client has read for {signal.idle_seconds:.0f} s")
    if isinstance(signal, hold.Unknown):
        who = (
            "whether a client reads this static service is unknown (the operator could not read the "
            "dispatcher's signal), so it counts as reading"
        )
    else:
        who = "a client reads this static service"
    why = (
        "a worker moved to another node would read its shard again from the start (the job would get those "
        "elements twice)"
    )
    forced = (
        "A worker a drain moves to another node reads its shard again from the start: the reading job gets "
        "those elements twice."
    )
    until = "within a minute after the last reader stops"
    unread = Unreadable(isinstance(signal, hold.Unknown), unreadable_since)
    return _held(svc, since, now, who, hold.readers_why(signal), why, forced, until, unread, cluster_max_wait)


@dataclass(frozen=True)
class Unreadable:
    """Whether what holds drains could not be read, and since when (None: since now)."""

    now: bool = False
    since: datetime | None = None


def _unreadable(saves: hold.Snapshots) -> bool:
    """Whether the snapshots hold drains only because they could not be read: no answer, or every
    snapshot counted as being written is one whose files could not be read."""
    if isinstance(saves, hold.Unknown):
        return True
    held = [s.state for s in saves.snapshots if s.state in (snapshotwire.IN_PROGRESS, snapshotwire.UNKNOWN)]
    return bool(held) and all(state == snapshotwire.UNKNOWN for state in held)


def _held_by_snapshot(
    svc: ServiceSpec,
    saving: str,
    since: datetime | None,
    now: datetime,
    unread: Unreadable,
    cluster_max_wait: int | None,
) -> DrainDecision:
    why = (
        "a drained worker writes its stream again from its last checkpoint (one that does not come back stalls "
        "the snapshot for good)"
    )
    forced = (
        "A drained worker writes its stream again from its last checkpoint, and one that does not come back "
        "stalls the snapshot for good."
    )
    until = "once no snapshot is being written"
    return _held(svc, since, now, saving, saving, why, forced, until, unread, cluster_max_wait)


def _held(
    svc: ServiceSpec,
    since: datetime | None,
    now: datetime,
    who: str,
    detail: str,
    why: str,
    forced: str,
    until: str,
    unread: Unreadable,
    cluster_max_wait: int | None,
) -> DrainDecision:
    """Drains held because ``who`` (readers, or a snapshot being written) and ``why`` a drain would harm
    them; they go ahead ``until``, or after ``rescaleMaxWaitSeconds`` (``hold.bound``) or the cluster's
    bound (``cluster_max_wait``), whichever is sooner, then ``forced``; or, when that could not be read
    (``unread``), after ``drainUnreadableMaxWaitSeconds``."""
    wait = hold.bound(svc, since, now)
    if wait.over:
        message = f"Drains go ahead although {who}: they waited rescaleMaxWaitSeconds ({wait.max_wait} s). {forced}"
        return DrainDecision(1, message, detail, waiting=True, forced=True, unreadable=unread.now)
    cluster = hold.Wait(wait.since, wait.waited, cluster_max_wait or None)
    if cluster.over:
        message = (
            f"Drains go ahead although {who}: they waited {cluster.max_wait} s, the longest this cluster lets a "
            f"service hold a node's drain (the operator's {CLUSTER_MAX_WAIT_FLAG}). {forced}"
        )
        return DrainDecision(1, message, detail, waiting=True, forced=True, unreadable=unread.now)
    recheck, deadline = min(wait.requeue(RECHECK_SECONDS), cluster.requeue(RECHECK_SECONDS)), wait.deadline
    ends = [w.since + timedelta(seconds=w.max_wait) for w in (wait, cluster) if w.max_wait is not None]
    if cluster.max_wait is not None and (wait.max_wait is None or cluster.max_wait < wait.max_wait):
        at = min(ends).strftime(coretypes.TIME_FORMAT)
        deadline = f", or at {at} (this cluster's bound on a held drain, {CLUSTER_MAX_WAIT_FLAG})"
    if unread.now:
        limit = svc.workers.drain_unreadable_max_wait_seconds
        start = unread.since or now
        waited = (now - start).total_seconds()
        if waited >= limit:
            message = (
                f"Drains go ahead although {who}: it could not be read for spec.workers.drainUnreadableMaxWaitSeconds "
                f"({limit} s), so nobody knows. {forced}"
            )
            return DrainDecision(1, message, detail, waiting=True, forced=True, unreadable=True)
        if not ends or start + timedelta(seconds=limit) < min(ends):
            at = (start + timedelta(seconds=limit)).strftime(coretypes.TIME_FORMAT)
            deadline += f", or at {at} if it still cannot be read (spec.workers.drainUnreadableMaxWaitSeconds)"
        recheck = min(recheck, max(0.5, limit - waited))
    message = (
        f"Drains wait: {who}, and {why}. They go ahead {until}{deadline}; set spec.workers.rescalePolicy: "
        "Immediate to let them go now."
    )
    return DrainDecision(0, message, detail, waiting=True, unreadable=unread.now, requeue_after=recheck)


def snapshots_valid_for(_: hold.Snapshots) -> float:
    """How long a reading of the snapshots decides the budget."""
    return RECHECK_SECONDS


def valid_for(signal: hold.Signal) -> float:
    """How long a reading decides the budget: RECHECK_SECONDS, or until a quiet moment would be long
    enough (no client reads, but one did less than hold.QUIET_SECONDS ago)."""
    if isinstance(signal, ServiceSignals) and not signal.reading and not hold.idle(signal):
        return max(0.5, hold.QUIET_SECONDS - signal.idle_seconds)
    return RECHECK_SECONDS


def event(decision: DrainDecision, name: str) -> tuple[str, str]:
    """The Event of a change of the budget: its reason and message."""
    budget = f"PodDisruptionBudget {name}: maxUnavailable {decision.max_unavailable}. "
    if decision.max_unavailable == 0:
        return reasons.DRAINS_HELD, f"{budget}{decision.message} ({decision.detail})"
    if decision.forced:
        return reasons.DRAINS_FORCED, f"{budget}{decision.message} ({decision.detail})"
    return reasons.DRAINS_ALLOWED, f"{budget}Drains go ahead: {decision.detail}."


def _why_free(svc: ServiceSpec, running: bool) -> str:
    if not svc.is_static:
        return "DYNAMIC: a drain loses at most a worker's in-flight splits"
    if svc.workers.rescale_policy == RESCALE_IMMEDIATE:
        return "rescalePolicy Immediate"
    return "no dispatcher pod runs, so no client reads" if not running else "no worker runs"
