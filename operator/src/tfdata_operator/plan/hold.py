"""Whether a change that breaks readers may be carried out now: ``spec.workers.rescalePolicy``.

Two changes fail every client that reads from a service: a new worker count of a static
service (the dispatcher restarts with a new worker list and a fresh journal, so the
clients' jobs are gone) and a suspend (every pod goes). With ``WhenIdle`` (the default)
such a change waits while the dispatcher's "is any client reading?" signal
(``signals.ServiceSignals``) says yes, or cannot be read: an unknown answer counts as
reading, so a change never breaks a reader it could not see. ``Immediate`` carries it out
at once. ``rescaleMaxWaitSeconds`` bounds the wait.

A snapshot being written (``tf.data.experimental.distributed_save``) is one more reason a change
must wait: a worker that leaves while it writes its stream stalls the snapshot for good. So every
change that takes a worker away (a suspend, a static rescale, and, on a dynamic service, a
scale-down, the autoscaler's or a person's) waits while the dispatcher's ``/v1/snapshots`` says
one is ``IN_PROGRESS``. Where ``spec.snapshots`` is set, an answer that cannot be read counts as
in progress (as an unknown reader signal counts as reading); elsewhere it does not (a service
without it rarely snapshots, and an unreadable endpoint must not hold its scale-downs).

Pure functions: the reconcile loop (``controller/decide.py``) gives them the spec, what it
observed and the signal, and reads the signal only when ``needs_signal`` says a decision
depends on it, never for a settled service.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from tfdata_operator.api import limits
from tfdata_operator.api.spec import RESCALE_IMMEDIATE, ServiceSpec
from tfdata_operator.wire import snapshots as snapshotwire
from tfdata_operator.wire.signals import ServiceSignals
from tfdata_operator.wire.snapshots import SnapshotsReport

Manifest = dict[str, Any]

# The signal must have said "nobody reads" for this long: a trainer that ends one epoch's
# iterator and opens the next one a moment later is not idle.
QUIET_SECONDS = 5.0
# How often a held change asks again. With the signal's own delay (0 s after a reader
# releases its iteration, ~12 s after a plain trainer's last element) and QUIET_SECONDS,
# a held change is carried out within 30 s after the last reader ends.
RECHECK_SECONDS = 5.0
# How often a change held by a snapshot asks again: a snapshot takes minutes to hours, and the
# dispatcher's answer is itself up to 5 s old.
SNAPSHOT_RECHECK_SECONDS = 15.0

PROCEED, HOLD, FORCE = "proceed", "hold", "force"


@dataclass(frozen=True)
class Pending:
    """A change that would break readers, not carried out yet."""

    change: str  # short, for `kubectl get`: "workers 3→4" or "suspend"
    what: str  # for sentences: "worker count change 3→4" or "suspend"
    current_workers: int  # the worker count the service keeps while the change is held
    # A static rescale and a suspend fail every reading client, so they wait for readers too; a
    # dynamic scale-down does not, and waits only while a snapshot is written.
    breaks_readers: bool = True

    @property
    def is_suspend(self) -> bool:
        return self.change == "suspend"


@dataclass(frozen=True)
class Unknown:
    """The signal could not be read; ``why`` says what went wrong. Counts as reading."""

    why: str


Signal = ServiceSignals | Unknown
# What the dispatcher's /v1/snapshots answered, or why it could not be read.
Snapshots = SnapshotsReport | Unknown


@dataclass(frozen=True)
class HoldDecision:
    action: str  # PROCEED, HOLD, or FORCE (carried out after rescaleMaxWaitSeconds despite readers)
    pending: Pending | None = None
    message: str = ""
    # Seconds until the loop should look again (a held change), else None.
    requeue_after: float | None = None
    # Held (or forced) because a snapshot is being written: a dynamic service keeps its workers too.
    snapshot: bool = False


def pending_change(
    svc: ServiceSpec, live_dispatcher: Manifest | None, live_workers: Manifest | None, live_list: list[str] | None
) -> Pending | None:
    """The reader-breaking change the spec asks for, given the live StatefulSets; None if there is none.

    A service whose pods are already gone (suspended) has no readers: resuming it, or changing
    its worker count meanwhile, is never held. Nor is a rescale already under way (the
    dispatcher's list and the worker count differ): its readers are broken already, and
    stopping halfway would leave the dispatcher waiting for workers that never come.

    A dynamic (or "OFF") service's scale-down breaks no reader, but stalls a snapshot being
    written: it is a pending change of a fault-tolerant dispatcher (the only kind that snapshots).
    """
    if live_dispatcher is None or live_workers is None:
        return None  # a new service: nobody can be reading yet
    if int(live_dispatcher.get("spec", {}).get("replicas", 1)) == 0:
        return None
    current = int(live_workers.get("spec", {}).get("replicas", 0))
    if svc.suspend:
        return Pending("suspend", "suspend", current)
    if not svc.is_static:
        if svc.workers.replicas >= current or not svc.dispatcher.fault_tolerant_mode:
            return None
        arrow = f"{current}→{svc.workers.replicas}"
        return Pending(f"workers {arrow}", f"scale-down {arrow}", current, breaks_readers=False)
    if svc.workers.replicas == current:
        return None
    if live_list is not None and len(live_list) != current:
        return None  # under way
    arrow = f"{current}→{svc.workers.replicas}"
    return Pending(f"workers {arrow}", f"worker count change {arrow}", current)


def dispatcher_running(dispatcher_pods: list[Manifest]) -> bool:
    """Whether a dispatcher pod runs: without one, no client can be reading."""
    return any(
        (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        for p in dispatcher_pods
    )


def needs_signal(svc: ServiceSpec, pending: Pending | None, running: bool) -> bool:
    reader_breaking = pending is not None and pending.breaks_readers
    return reader_breaking and svc.workers.rescale_policy != RESCALE_IMMEDIATE and running


def needs_snapshots(svc: ServiceSpec, pending: Pending | None, running: bool) -> bool:
    """Whether the decision depends on the dispatcher's snapshots: a change that takes workers away from a
    fault-tolerant dispatcher (the only kind TensorFlow lets snapshot) that runs, under WhenIdle."""
    return (
        pending is not None
        and svc.dispatcher.fault_tolerant_mode
        and svc.workers.rescale_policy != RESCALE_IMMEDIATE
        and running
    )


def decide(
    svc: ServiceSpec,
    pending: Pending | None,
    running: bool,
    signal: Signal | None,
    held_since: datetime | None,
    now: datetime,
    snapshots: Snapshots | None = None,
) -> HoldDecision:
    """Proceed, hold (with a message a person can act on, and when to look again), or force after the maximum wait.

    ``signal`` is what the dispatcher answered, read only when ``needs_signal``; ``held_since``
    is when the change started waiting (from the status), None if it does not wait yet;
    ``snapshots`` is the dispatcher's ``/v1/snapshots``, read only when ``needs_snapshots``.
    A snapshot being written holds the change first; once none is, readers may still hold it.
    """
    if pending is None:
        return HoldDecision(PROCEED)
    if svc.workers.rescale_policy == RESCALE_IMMEDIATE:
        return HoldDecision(
            PROCEED, pending, f"{_capital(pending.what)} carried out at once (rescalePolicy Immediate)."
        )
    if not running:
        return HoldDecision(
            PROCEED, pending, f"{_capital(pending.what)} carried out: no dispatcher pod runs, so no client reads."
        )
    if svc.snapshots is not None and snapshots is None:
        snapshots = Unknown("the snapshots were not read")
    if (saving := writing(svc, snapshots)) is not None:
        return _held_for_snapshot(svc, pending, saving, held_since, now)
    if not pending.breaks_readers:
        return HoldDecision(PROCEED, pending, f"{_capital(pending.what)} carried out: no snapshot is being written.")
    return _held_for_readers(svc, pending, signal, held_since, now)


def _held_for_snapshot(
    svc: ServiceSpec, pending: Pending, saving: str, held_since: datetime | None, now: datetime
) -> HoldDecision:
    """A snapshot is being written (``saving`` says which): hold the change, or force it after the maximum wait."""
    wait = bound(svc, held_since, now)
    if wait.over:
        message = (
            f"{_capital(pending.what)} carried out after waiting {wait.waited:.0f} s (rescaleMaxWaitSeconds "
            f"{wait.max_wait}) although {saving}. A snapshot whose worker leaves may never complete."
        )
        return HoldDecision(FORCE, pending, message, snapshot=True)
    message = (
        f"{_capital(pending.what)} waits: {saving}, and a worker that leaves while a snapshot is written "
        f"stalls it for good. It is carried out once no snapshot is being written{wait.deadline}; set "
        "spec.workers.rescalePolicy: Immediate to carry it out now (the snapshot then never completes)."
    )
    return HoldDecision(HOLD, pending, message, wait.requeue(SNAPSHOT_RECHECK_SECONDS), snapshot=True)


def _held_for_readers(
    svc: ServiceSpec, pending: Pending, signal: Signal | None, held_since: datetime | None, now: datetime
) -> HoldDecision:
    """A reader-breaking change: proceed after a quiet moment, hold while clients read, or force after the
    maximum wait."""
    if signal is None:
        signal = Unknown("the signal was not read")
    if isinstance(signal, ServiceSignals) and not signal.reading:
        if signal.idle_seconds >= QUIET_SECONDS:
            idle = f"no client has read for {signal.idle_seconds:.0f} s"
            return HoldDecision(PROCEED, pending, f"{_capital(pending.what)} carried out: {idle}.")
        message = (
            f"{_capital(pending.what)} waits for a quiet moment: no client reads, for {signal.idle_seconds:.0f} s "
            f"of the {QUIET_SECONDS:.0f} s it waits for."
        )
        return HoldDecision(HOLD, pending, message, max(0.5, QUIET_SECONDS - signal.idle_seconds))

    why = readers_why(signal)
    wait = bound(svc, held_since, now)
    if wait.over:
        message = (
            f"{_capital(pending.what)} carried out after waiting {wait.waited:.0f} s (rescaleMaxWaitSeconds "
            f"{wait.max_wait}) although {why}. Those readers fail."
        )
        return HoldDecision(FORCE, pending, message)
    message = (
        f"{_capital(pending.what)} waits: {why}. It is carried out within 30 s after the last reader ends"
        f"{wait.deadline}; set spec.workers.rescalePolicy: Immediate to carry it out now (reading clients then fail)."
    )
    return HoldDecision(HOLD, pending, message, wait.requeue(RECHECK_SECONDS))


# A held change names at most this many snapshot paths, each cut to MAX_PATH_CHARACTERS: a path
# may be 4096 characters long, and status.held.message and a condition's message hold at most 4096.
MAX_NAMED_SNAPSHOTS = 3
MAX_PATH_CHARACTERS = 256


def writing(svc: ServiceSpec, snapshots: Snapshots | None) -> str | None:
    """Which snapshots a worker removal waits for, for a sentence; None when none is being written.

    An answer that could not be read, and a snapshot whose files could not be read, count as being
    written only where ``spec.snapshots`` is set."""
    configured = svc.snapshots is not None
    if snapshots is None:
        return None
    if isinstance(snapshots, Unknown):
        if not configured:
            return None
        why = limits.clip(snapshots.why, 2 * MAX_PATH_CHARACTERS)
        return f"whether a snapshot is being written is unknown ({why}), so it counts as being written"
    states = (snapshotwire.IN_PROGRESS, snapshotwire.UNKNOWN) if configured else (snapshotwire.IN_PROGRESS,)
    paths = [s.path for s in snapshots.snapshots if s.state in states]
    if not paths:
        return None
    named = ", ".join(limits.clip(p, MAX_PATH_CHARACTERS) for p in paths[:MAX_NAMED_SNAPSHOTS])
    if len(paths) > MAX_NAMED_SNAPSHOTS:
        named += f" and {len(paths) - MAX_NAMED_SNAPSHOTS} more"
    unreadable = [s.path for s in snapshots.snapshots if s.state == snapshotwire.UNKNOWN and s.path in paths]
    note = " (those whose files cannot be read count as being written)" if unreadable else ""
    if len(paths) == 1:
        return f"snapshot {named} is being written{note}"
    return f"snapshots {named} are being written{note}"


def idle(signal: Signal) -> bool:
    """Whether nobody has read for QUIET_SECONDS: an unknown answer counts as reading."""
    return isinstance(signal, ServiceSignals) and not signal.reading and signal.idle_seconds >= QUIET_SECONDS


def readers_why(signal: Signal) -> str:
    """Why a wait for readers goes on, for a sentence: who reads, or that nobody knows."""
    if isinstance(signal, Unknown):
        return f"whether a client reads is unknown ({signal.why}), so it counts as reading"
    return "clients read from the service: " + "; ".join(signal.reasons)


@dataclass(frozen=True)
class Wait:
    """A wait for readers that started at ``since``, bounded by ``rescaleMaxWaitSeconds`` (None: unbounded)."""

    since: datetime
    waited: float
    max_wait: int | None

    @property
    def over(self) -> bool:
        return self.max_wait is not None and self.waited >= self.max_wait

    @property
    def deadline(self) -> str:
        """ ", or at <time> (rescaleMaxWaitSeconds)" when the wait is bounded, for a sentence."""
        if self.max_wait is None:
            return ""
        at = (self.since + timedelta(seconds=self.max_wait)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f", or at {at} (rescaleMaxWaitSeconds)"

    def requeue(self, recheck: float) -> float:
        """When to look again: after ``recheck`` seconds, or when the bound is reached if that is sooner."""
        if self.max_wait is None:
            return recheck
        return min(recheck, max(0.5, self.max_wait - self.waited))


def bound(svc: ServiceSpec, since: datetime | None, now: datetime) -> Wait:
    """The one clock of every wait for readers: from ``since`` (kept in the status; None: it starts
    now) to ``spec.workers.rescaleMaxWaitSeconds``. A held change and a held drain both use it."""
    start = since or now
    return Wait(start, (now - start).total_seconds(), svc.workers.rescale_max_wait_seconds)


def effective_spec(svc: ServiceSpec, decision: HoldDecision) -> ServiceSpec:
    """The spec the children follow now: while a change is held, the worker count and pods it would change stay.

    A dynamic service held by a snapshot keeps at least the workers it has (more may still start)."""
    if decision.action != HOLD or decision.pending is None:
        return svc
    current = decision.pending.current_workers
    if svc.is_static:
        replicas = current
    else:
        replicas = max(svc.workers.replicas, current) if decision.snapshot else svc.workers.replicas
    return replace(svc, suspend=False, workers=replace(svc.workers, replicas=replicas))


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]
