"""Conditions and status computed from the observed children."""

from __future__ import annotations

from typing import Any

from tfdata_operator import builders, hold, status
from tfdata_operator.builders import BuildSettings

from cases import body, parse

SETTINGS = BuildSettings()


def sts(replicas: int, ready: int, revision: str = "r1", update: str = "r1") -> dict[str, Any]:
    return {
        "metadata": {"generation": 2},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 2,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas,
            "currentRevision": revision,
            "updateRevision": update,
        },
    }


def conditions(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in st["conditions"]}


def test_ready_when_dispatcher_and_all_workers_are_ready() -> None:
    svc = parse(shardingPolicy="FILE")
    dispatcher = {**builders.build_dispatcher_statefulset(svc, SETTINGS, 2), "status": sts(1, 1)["status"]}
    st = status.compute_status(svc, body(), status.Observed(dispatcher, sts(2, 2)), SETTINGS, "T1")
    c = conditions(st)
    assert c["Ready"]["status"] == "True" and c["Ready"]["reason"] == "Ready"
    assert c["DispatcherReady"]["status"] == c["WorkersReady"]["status"] == "True"
    assert st["workers"] == {"replicas": 2, "readyReplicas": 2, "summary": "2/2", "desired": 2, "current": 2}
    assert st["held"] is None and "Suspended" not in c
    assert st["dispatcherAddress"] == "grpc://demo-dispatcher.ml.svc.cluster.local:5050"
    assert st["workerAddresses"] == builders.worker_addresses(svc, SETTINGS, 2)
    assert st["selector"] == builders.worker_selector(svc)
    assert st["observedGeneration"] == 1


def test_not_ready_says_which_part_is_missing() -> None:
    svc = parse()
    st = status.compute_status(svc, body(), status.Observed(sts(1, 1), sts(2, 1)), SETTINGS, "T1")
    c = conditions(st)
    assert c["Ready"]["status"] == "False"
    assert c["Ready"]["reason"] == "WorkersNotReady"
    assert "1/2" in c["Ready"]["message"]


def test_restarting_dispatcher() -> None:
    st = status.compute_status(parse(), body(), status.Observed(sts(1, 0, "r1", "r2"), sts(2, 2)), SETTINGS, "T")
    assert conditions(st)["DispatcherReady"]["reason"] == "DispatcherRestarting"


def test_waiting_for_scale_order_is_reported() -> None:
    st = status.compute_status(
        parse(), body(), status.Observed(sts(1, 1), sts(2, 2)), SETTINGS, "T", waiting="Scaling up: waiting"
    )
    assert conditions(st)["WorkersReady"]["reason"] == "Scaling"


def test_invalid_spec_wins_and_keeps_observed_counts() -> None:
    st = status.compute_status(None, body(), status.Observed(sts(1, 1), sts(2, 2)), SETTINGS, "T", invalid="bad: x")
    c = conditions(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"], c["Ready"]["message"]) == ("False", "InvalidSpec", "bad: x")
    assert st["workers"]["readyReplicas"] == 2


def test_transition_time_changes_only_when_status_flips() -> None:
    svc = parse()
    first = status.compute_status(svc, body(), status.Observed(sts(1, 1), sts(2, 1)), SETTINGS, "T1")
    again = status.compute_status(
        svc, {**body(), "status": first}, status.Observed(sts(1, 1), sts(2, 1)), SETTINGS, "T2"
    )
    assert not status.status_differs(first, again), "an unchanged world must give an identical status"
    flipped = status.compute_status(
        svc, {**body(), "status": first}, status.Observed(sts(1, 1), sts(2, 2)), SETTINGS, "T3"
    )
    c = conditions(flipped)
    assert c["Ready"]["lastTransitionTime"] == "T3"
    assert c["DispatcherReady"]["lastTransitionTime"] == "T1"


def test_a_held_rescale_shows_desired_and_current_and_why() -> None:
    svc = parse(shardingPolicy="FILE", workers={"replicas": 3})
    held = hold.Decision(
        hold.HOLD,
        hold.Pending("workers 2→3", "worker count change 2→3", 2),
        "waits: reading",
    )
    st = status.compute_status(
        svc,
        body(),
        status.Observed(sts(1, 1), sts(2, 2)),
        SETTINGS,
        "T1",
        decision=held,
    )
    c = conditions(st)
    assert (c["Ready"]["reason"], c["Ready"]["message"]) == (
        "RescaleHeld",
        "waits: reading",
    )
    assert c["WorkersReady"]["reason"] == "RescaleHeld" and c["DispatcherReady"]["status"] == "True"
    assert st["held"] == {
        "change": "workers 2→3",
        "since": "T1",
        "message": "waits: reading",
    }
    assert (st["workers"]["desired"], st["workers"]["current"]) == (3, 2)
    # Still held later: it has waited since the first time.
    again = status.compute_status(
        svc,
        {**body(), "status": st},
        status.Observed(sts(1, 1), sts(2, 2)),
        SETTINGS,
        "T2",
        decision=held,
    )
    assert again["held"]["since"] == "T1"


def test_suspended_and_resumed() -> None:
    svc = parse(suspend=True)
    stopping = status.compute_status(svc, body(), status.Observed(sts(0, 0), sts(0, 0)), SETTINGS, "T1")
    c = conditions(stopping)
    assert c["Suspended"]["status"] == "True" and "no pod runs" in c["Suspended"]["message"]
    assert c["Ready"]["reason"] == c["DispatcherReady"]["reason"] == c["WorkersReady"]["reason"] == "Suspended"
    assert stopping["dispatcherAddress"] == "grpc://demo-dispatcher.ml.svc.cluster.local:5050"
    resumed = status.compute_status(
        parse(),
        {**body(), "status": stopping},
        status.Observed(sts(1, 1), sts(2, 2)),
        SETTINGS,
        "T2",
    )
    c = conditions(resumed)
    assert (c["Suspended"]["status"], c["Suspended"]["reason"]) == ("False", "Resumed")
    assert c["Ready"]["status"] == "True"
