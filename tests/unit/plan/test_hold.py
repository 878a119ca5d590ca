"""The hold decision: a change that would break readers waits while any client reads (or nobody knows)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tfdata_operator.api import spec
from tfdata_operator.plan import hold
from tfdata_operator.wire import snapshots as snapshotwire
from tfdata_operator.wire.signals import ServiceSignals
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsReport

from fixtures.cases import parse
from fixtures.support import service_signals

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)
LIST3 = ["a", "b", "c"]


def sts(replicas: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}}


def signal(reading: bool, idle: float = 0.0) -> ServiceSignals:
    return service_signals(reading, idle, ("2 clients attached to jobs",) if reading else ())


def svc(policy: str = "FILE", replicas: int = 4, suspend: bool = False, **workers: Any) -> spec.ServiceSpec:
    return parse(
        shardingPolicy=policy,
        suspend=suspend,
        workers={"replicas": replicas, **workers},
    )


# (id, spec, live dispatcher replicas, live worker replicas, live list, the change it finds)
PENDING = [
    ("settled static service", svc(replicas=3), 1, 3, LIST3, None),
    ("static scale up", svc(replicas=4), 1, 3, LIST3, "workers 3→4"),
    ("static scale down", svc(replicas=2), 1, 3, LIST3, "workers 3→2"),
    (
        "static scale under way (dispatcher has the longer list)",
        svc(replicas=4),
        1,
        3,
        ["a", "b", "c", "d"],
        None,
    ),
    ("dynamic scale", svc("DYNAMIC", replicas=4), 1, 3, None, None),
    # A dynamic scale-down breaks no reader, but a snapshot being written waits for it.
    ("dynamic scale down", svc("DYNAMIC", replicas=2), 1, 3, None, "workers 3→2"),
    (
        "dynamic scale to zero",
        parse(shardingPolicy="DYNAMIC", workers={"replicas": 0}, autoscaling={"minReplicas": 0, "maxReplicas": 4}),
        1,
        3,
        None,
        "workers 3→0",
    ),
    ('"OFF" scale down', svc("OFF", replicas=1), 1, 3, None, "workers 3→1"),
    (
        "dynamic scale down without a journal (no snapshot can run)",
        parse(shardingPolicy="DYNAMIC", workers={"replicas": 2}, dispatcher={"faultTolerantMode": False}),
        1,
        3,
        None,
        None,
    ),
    ('"OFF" scale', svc("OFF", replicas=4), 1, 3, None, None),
    (
        "suspend of a running service",
        svc(replicas=3, suspend=True),
        1,
        3,
        LIST3,
        "suspend",
    ),
    (
        "suspend of a running dynamic service",
        svc("DYNAMIC", replicas=3, suspend=True),
        1,
        3,
        None,
        "suspend",
    ),
    ("already suspended", svc(replicas=3, suspend=True), 0, 0, LIST3, None),
    ("resume", svc(replicas=3), 0, 0, LIST3, None),
    ("rescale while suspended", svc(replicas=5, suspend=True), 0, 0, LIST3, None),
    ("a new service", svc(replicas=3), None, None, None, None),
]


@pytest.mark.parametrize(("spec_", "dispatcher", "workers", "live_list", "change"), [p[1:] for p in PENDING],
                         ids=[p[0] for p in PENDING])  # fmt: skip
def test_the_pending_change(
    spec_: spec.ServiceSpec,
    dispatcher: int | None,
    workers: int | None,
    live_list: list[str] | None,
    change: str | None,
) -> None:
    d = None if dispatcher is None else sts(dispatcher)
    w = None if workers is None else sts(workers)
    pending = hold.pending_change(spec_, d, w, live_list)
    assert (pending.change if pending else None) == change


UP = hold.Pending("workers 3→4", "worker count change 3→4", 3)
SUSPEND = hold.Pending("suspend", "suspend", 3)
IMMEDIATE = svc(rescalePolicy="Immediate")
MAX_WAIT = svc(rescaleMaxWaitSeconds=600)
LONG_AGO = NOW - timedelta(seconds=601)
RECENTLY = NOW - timedelta(seconds=60)

# (id, spec, pending, dispatcher running, signal, held since, action, requeue after, words in the message)
DECISIONS = [
    ("nothing pending", svc(), None, True, None, None, hold.PROCEED, None, ""),
    ("idle for long enough", svc(), UP, True, signal(False, idle=9), None, hold.PROCEED, None,
     "no client has read for 9 s"),
    ("idle, but not for long", svc(), UP, True, signal(False, idle=2), None, hold.HOLD, 3.0, "quiet moment"),
    ("a client reads", svc(), UP, True, signal(True), None, hold.HOLD, 5.0,
     "Worker count change 3→4 waits: clients read from the service: 2 clients attached to jobs"),
    ("the message says how to go ahead", svc(), UP, True, signal(True), None, hold.HOLD, 5.0,
     "set spec.workers.rescalePolicy: Immediate to carry it out now"),
    ("unknown counts as reading", svc(), UP, True, hold.Unknown("connection refused"), None, hold.HOLD, 5.0,
     "unknown (connection refused), so it counts as reading"),
    ("not read counts as reading", svc(), UP, True, None, None, hold.HOLD, 5.0, "unknown"),
    ("Immediate never waits", IMMEDIATE, UP, True, signal(True), None, hold.PROCEED, None, "at once"),
    ("no dispatcher pod runs: nobody reads", svc(), UP, False, None, None, hold.PROCEED, None,
     "no dispatcher pod runs"),
    ("max wait not reached", MAX_WAIT, UP, True, signal(True), RECENTLY, hold.HOLD, 5.0,
     "or at 2026-11-23T12:09:00Z (rescaleMaxWaitSeconds)"),
    ("max wait nearly reached: look again then", MAX_WAIT, UP, True, signal(True), NOW - timedelta(seconds=598),
     hold.HOLD, 2.0, "waits"),
    ("max wait passed", MAX_WAIT, UP, True, signal(True), LONG_AGO, hold.FORCE, None,
     "carried out after waiting 601 s (rescaleMaxWaitSeconds 600) although clients read"),
    ("max wait passed, unknown signal", MAX_WAIT, UP, True, hold.Unknown("timed out"), LONG_AGO, hold.FORCE, None,
     "unknown (timed out)"),
    ("a suspend waits like a rescale", svc(suspend=True), SUSPEND, True, signal(True), None, hold.HOLD, 5.0,
     "Suspend waits"),
    ("a suspend goes ahead when idle", svc(suspend=True), SUSPEND, True, signal(False, 30), None, hold.PROCEED, None,
     "Suspend carried out"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec_", "pending", "running", "signal_", "since", "action", "requeue", "says"),
    [d[1:] for d in DECISIONS],
    ids=[d[0] for d in DECISIONS],
)
def test_the_decision(
    spec_: spec.ServiceSpec,
    pending: hold.Pending | None,
    running: bool,
    signal_: hold.Signal | None,
    since: datetime | None,
    action: str,
    requeue: float | None,
    says: str,
) -> None:
    decision = hold.decide(spec_, pending, running, signal_, since, NOW)
    assert decision.action == action
    assert decision.requeue_after == (pytest.approx(requeue) if requeue is not None else None)
    assert says in decision.message


@pytest.mark.parametrize(
    ("spec_", "pending", "running", "needed"),
    [
        (svc(), None, True, False),  # a settled service: never read
        (svc(), UP, True, True),
        (IMMEDIATE, UP, True, False),
        (svc(), UP, False, False),
        (svc(suspend=True), SUSPEND, True, True),
    ],
)
def test_the_signal_is_read_only_when_the_decision_depends_on_it(
    spec_: spec.ServiceSpec, pending: hold.Pending | None, running: bool, needed: bool
) -> None:
    assert hold.needs_signal(spec_, pending, running) is needed


def test_a_held_change_keeps_the_current_worker_count_and_the_pods() -> None:
    held = hold.decide(svc(replicas=4), UP, True, signal(True), None, NOW)
    assert hold.effective_spec(svc(replicas=4), held).workers.replicas == 3
    held_suspend = hold.decide(svc(replicas=3, suspend=True), SUSPEND, True, signal(True), None, NOW)
    kept = hold.effective_spec(svc(replicas=3, suspend=True), held_suspend)
    assert kept.suspend is False and kept.workers.replicas == 3
    go = hold.decide(svc(replicas=4), UP, True, signal(False, 60), None, NOW)
    assert hold.effective_spec(svc(replicas=4), go) == svc(replicas=4)


def test_a_dispatcher_pod_that_is_pending_or_stopping_serves_no_reader() -> None:
    running = {"metadata": {"name": "d-0"}, "status": {"phase": "Running"}}
    stopping = {
        "metadata": {"name": "d-0", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Running"},
    }
    assert hold.dispatcher_running([running])
    assert not hold.dispatcher_running([stopping, {"metadata": {"name": "d-0"}, "status": {"phase": "Pending"}}])
    assert not hold.dispatcher_running([])


# --- Snapshots being written: one more reason a change that takes workers away waits ------------------


def saves(*states: str) -> SnapshotsReport:
    """The dispatcher's /v1/snapshots, one journaled snapshot per state: gs://b/s0, gs://b/s1, ..."""
    found = tuple(SnapshotProgress(f"gs://b/s{i}", state, journaled=True) for i, state in enumerate(states))
    return SnapshotsReport(found, "snapshots named in the journal")


SNAPSHOTS = {"snapshots": {"directory": "gs://b"}}
DOWN = hold.Pending("workers 3→2", "scale-down 3→2", 3, breaks_readers=False)
DYNAMIC = svc("DYNAMIC", replicas=2)


def snap_svc(policy: str = "DYNAMIC", replicas: int = 2, suspend: bool = False, **workers: Any) -> spec.ServiceSpec:
    return parse(shardingPolicy=policy, suspend=suspend, workers={"replicas": replicas, **workers}, **SNAPSHOTS)


WRITING = saves(snapshotwire.COMPLETED, snapshotwire.IN_PROGRESS)
DONE = saves(snapshotwire.COMPLETED, snapshotwire.FAILED, snapshotwire.MISSING)
UNREADABLE = hold.Unknown("GET http://10.0.0.9:8080/v1/snapshots failed: connection refused")

# (id, spec, pending, reader signal, snapshots, held since, action, requeue after, words in the message)
SNAPSHOT_DECISIONS = [
    ("a scale-down waits while a snapshot is written", DYNAMIC, DOWN, None, WRITING, None, hold.HOLD, 15.0,
     "Scale-down 3→2 waits: snapshot gs://b/s1 is being written, and a worker that leaves while a snapshot is "
     "written stalls it for good"),
    ("the message says how to go ahead", DYNAMIC, DOWN, None, WRITING, None, hold.HOLD, 15.0,
     "set spec.workers.rescalePolicy: Immediate to carry it out now (the snapshot then never completes)"),
    ("a scale-down goes ahead once every snapshot is done", DYNAMIC, DOWN, None, DONE, None, hold.PROCEED, None,
     "Scale-down 3→2 carried out: no snapshot is being written."),
    ("a scale-down with no snapshot at all goes ahead", DYNAMIC, DOWN, None, saves(), None, hold.PROCEED, None,
     "no snapshot"),
    ("unknown holds where spec.snapshots is set", snap_svc(), DOWN, None, UNREADABLE, None, hold.HOLD, 15.0,
     "whether a snapshot is being written is unknown (GET http://10.0.0.9:8080/v1/snapshots failed: connection "
     "refused), so it counts as being written"),
    ("not read holds where spec.snapshots is set", snap_svc(), DOWN, None, None, None, hold.HOLD, 15.0,
     "the snapshots were not read"),
    ("unknown does not hold without spec.snapshots", DYNAMIC, DOWN, None, UNREADABLE, None, hold.PROCEED, None,
     "carried out"),
    ("an unreadable snapshot holds where spec.snapshots is set", snap_svc(), DOWN, None,
     saves(snapshotwire.UNKNOWN), None, hold.HOLD, 15.0, "snapshot gs://b/s0 is being written (those whose files "
     "cannot be read count as being written)"),
    ("an unreadable snapshot does not hold without spec.snapshots", DYNAMIC, DOWN, None,
     saves(snapshotwire.UNKNOWN), None, hold.PROCEED, None, "carried out"),
    ("many snapshots are named up to three", DYNAMIC, DOWN, None, saves(*[snapshotwire.IN_PROGRESS] * 5), None,
     hold.HOLD, 15.0, "snapshots gs://b/s0, gs://b/s1, gs://b/s2 and 2 more are being written"),
    ("a static rescale waits for the snapshot before the readers", svc(), UP, signal(False, 60), WRITING, None,
     hold.HOLD, 15.0, "Worker count change 3→4 waits: snapshot gs://b/s1"),
    ("then for its readers", svc(), UP, signal(True), DONE, None, hold.HOLD, 5.0, "clients read"),
    ("a suspend waits for the snapshot", svc("DYNAMIC", suspend=True), SUSPEND, signal(False, 60), WRITING, None,
     hold.HOLD, 15.0, "Suspend waits: snapshot gs://b/s1 is being written"),
    ("rescaleMaxWaitSeconds bounds the wait", svc("DYNAMIC", replicas=2, rescaleMaxWaitSeconds=600), DOWN, None,
     WRITING, LONG_AGO, hold.FORCE, None, "carried out after waiting 601 s (rescaleMaxWaitSeconds 600) although "
     "snapshot gs://b/s1 is being written. A snapshot whose worker leaves may never complete."),
    ("Immediate never waits", svc("DYNAMIC", replicas=2, rescalePolicy="Immediate"), DOWN, None, WRITING, None,
     hold.PROCEED, None, "at once"),
]  # fmt: skip


@pytest.mark.parametrize("row", SNAPSHOT_DECISIONS, ids=[d[0] for d in SNAPSHOT_DECISIONS])
def test_the_decision_with_snapshots(row: tuple[Any, ...]) -> None:
    _, spec_, pending, signal_, snapshots, since, action, requeue, says = row
    decision = hold.decide(spec_, pending, True, signal_, since, NOW, snapshots)
    assert (decision.action, decision.requeue_after) == (action, requeue)
    assert says in decision.message
    assert decision.snapshot is ("snapshot" in says and action != hold.PROCEED)


@pytest.mark.parametrize(
    ("spec_", "pending", "running", "snapshots", "signal_"),
    [
        (DYNAMIC, None, True, False, False),  # a settled service: nothing is read
        (DYNAMIC, DOWN, True, True, False),  # a dynamic scale-down: the snapshots only
        (svc(), UP, True, True, True),  # a static rescale: both
        (svc(suspend=True), SUSPEND, True, True, True),
        (DYNAMIC, DOWN, False, False, False),  # no dispatcher pod runs
        (svc("DYNAMIC", replicas=2, rescalePolicy="Immediate"), DOWN, True, False, False),
        (parse(shardingPolicy="FILE", workers={"replicas": 4}, dispatcher={"faultTolerantMode": False}), UP, True,
         False, True),  # no journal: no snapshot
    ],
)  # fmt: skip
def test_the_snapshots_are_read_only_when_a_change_would_take_workers_away(
    spec_: spec.ServiceSpec, pending: hold.Pending | None, running: bool, snapshots: bool, signal_: bool
) -> None:
    assert hold.needs_snapshots(spec_, pending, running) is snapshots
    assert hold.needs_signal(spec_, pending, running) is signal_


def test_a_dynamic_service_held_by_a_snapshot_keeps_its_workers_and_may_still_grow() -> None:
    held = hold.decide(DYNAMIC, DOWN, True, None, None, NOW, WRITING)
    assert hold.effective_spec(DYNAMIC, held).workers.replicas == 3
    suspend = svc("DYNAMIC", replicas=2, suspend=True)
    held_suspend = hold.decide(suspend, SUSPEND, True, None, None, NOW, WRITING)
    kept = hold.effective_spec(suspend, held_suspend)
    assert kept.suspend is False and kept.workers.replicas == 3
    grow = svc("DYNAMIC", replicas=5, suspend=True)
    assert hold.effective_spec(grow, hold.decide(grow, SUSPEND, True, None, None, NOW, WRITING)).workers.replicas == 5
    done = hold.decide(DYNAMIC, DOWN, True, None, None, NOW, DONE)
    assert hold.effective_spec(DYNAMIC, done) == DYNAMIC


def test_a_held_message_stays_within_a_status_message_however_long_the_paths() -> None:
    long = SnapshotsReport(
        tuple(SnapshotProgress("gs://b/" + "x" * 4000 + str(i), snapshotwire.IN_PROGRESS) for i in range(5)), "journal"
    )
    decision = hold.decide(DYNAMIC, DOWN, True, None, None, NOW, long)
    assert decision.action == hold.HOLD and len(decision.message) < 4096 and "and 2 more" in decision.message
