"""Conditions and status computed from the observed children."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tfdata_operator.api import reasons
from tfdata_operator.plan import drain, hold, status
from tfdata_operator.plan.diagnose import Finding
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import body, parse

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
    st = status.compute_status(svc, body(), status.Servers(dispatcher, sts(2, 2)), SETTINGS, "T1")
    c = conditions(st)
    assert c["Ready"]["status"] == "True" and c["Ready"]["reason"] == "Ready"
    assert c["DispatcherReady"]["status"] == c["WorkersReady"]["status"] == "True"
    assert st["workers"] == {"replicas": 2, "readyReplicas": 2, "summary": "2/2", "desired": 2, "current": 2}
    assert st["held"] is None and "Suspended" not in c
    assert st["dispatcherAddress"] == "grpc://demo-dispatcher.ml.svc.cluster.local:5050"
    assert st["workerAddresses"] == builders.worker_addresses(svc, SETTINGS, 2)
    assert st["selector"] == builders.worker_selector(svc)
    assert st["observedGeneration"] == 1


def test_scaled_to_zero_is_ready_and_says_so() -> None:
    svc = parse(shardingPolicy="DYNAMIC", workers={"replicas": 0}, autoscaling={"minReplicas": 0, "maxReplicas": 4})
    dispatcher = {**builders.build_dispatcher_statefulset(svc, SETTINGS, 0), "status": sts(1, 1)["status"]}
    st = status.compute_status(svc, body(), status.Servers(dispatcher, sts(0, 0)), SETTINGS, "T1")
    c = conditions(st)
    assert (c["WorkersReady"]["status"], c["WorkersReady"]["reason"]) == ("True", reasons.SCALED_TO_ZERO)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", reasons.SCALED_TO_ZERO)
    assert c["Ready"]["message"] == (
        "The dispatcher serves. No worker runs: no client has read for the autoscaler's window "
        "(spec.autoscaling.minReplicas 0). The first client to read brings a worker and waits for it."
    )
    assert st["workers"]["summary"] == "0/0"
    # On the way down (the StatefulSet still has a pod), and with a dispatcher that does not serve: not Ready.
    assert (
        conditions(status.compute_status(svc, body(), status.Servers(dispatcher, sts(1, 1)), SETTINGS, "T1"))["Ready"][
            "status"
        ]
        == "False"
    )
    down = {**dispatcher, "status": sts(1, 0)["status"]}
    assert (
        conditions(status.compute_status(svc, body(), status.Servers(down, sts(0, 0)), SETTINGS, "T1"))["Ready"][
            "reason"
        ]
        != reasons.SCALED_TO_ZERO
    )


def test_not_ready_says_which_part_is_missing() -> None:
    svc = parse()
    st = status.compute_status(svc, body(), status.Servers(sts(1, 1), sts(2, 1)), SETTINGS, "T1")
    c = conditions(st)
    assert c["Ready"]["status"] == "False"
    assert c["Ready"]["reason"] == "WorkersNotReady"
    assert "1/2" in c["Ready"]["message"]


def test_restarting_dispatcher() -> None:
    st = status.compute_status(parse(), body(), status.Servers(sts(1, 0, "r1", "r2"), sts(2, 2)), SETTINGS, "T")
    assert conditions(st)["DispatcherReady"]["reason"] == "DispatcherRestarting"


def test_waiting_for_scale_order_is_reported() -> None:
    st = status.compute_status(
        parse(), body(), status.Servers(sts(1, 1), sts(2, 2)), SETTINGS, "T", waiting="Scaling up: waiting"
    )
    assert conditions(st)["WorkersReady"]["reason"] == "Scaling"


def test_invalid_spec_wins_and_keeps_observed_counts() -> None:
    st = status.compute_status(None, body(), status.Servers(sts(1, 1), sts(2, 2)), SETTINGS, "T", invalid="bad: x")
    c = conditions(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"], c["Ready"]["message"]) == ("False", "InvalidSpec", "bad: x")
    assert st["workers"]["readyReplicas"] == 2


def test_transition_time_changes_only_when_status_flips() -> None:
    svc = parse()
    first = status.compute_status(svc, body(), status.Servers(sts(1, 1), sts(2, 1)), SETTINGS, "T1")
    again = status.compute_status(
        svc, {**body(), "status": first}, status.Servers(sts(1, 1), sts(2, 1)), SETTINGS, "T2"
    )
    assert not status.status_differs(first, again), "an unchanged world must give an identical status"
    flipped = status.compute_status(
        svc, {**body(), "status": first}, status.Servers(sts(1, 1), sts(2, 2)), SETTINGS, "T3"
    )
    c = conditions(flipped)
    assert c["Ready"]["lastTransitionTime"] == "T3"
    assert c["DispatcherReady"]["lastTransitionTime"] == "T1"


def test_a_held_rescale_shows_desired_and_current_and_why() -> None:
    svc = parse(shardingPolicy="FILE", workers={"replicas": 3})
    held = hold.HoldDecision(
        hold.HOLD,
        hold.Pending("workers 2→3", "worker count change 2→3", 2),
        "waits: reading",
    )
    st = status.compute_status(
        svc,
        body(),
        status.Servers(sts(1, 1), sts(2, 2)),
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
        status.Servers(sts(1, 1), sts(2, 2)),
        SETTINGS,
        "T2",
        decision=held,
    )
    assert again["held"]["since"] == "T1"


def test_suspended_and_resumed() -> None:
    svc = parse(suspend=True)
    stopping = status.compute_status(svc, body(), status.Servers(sts(0, 0), sts(0, 0)), SETTINGS, "T1")
    c = conditions(stopping)
    assert c["Suspended"]["status"] == "True" and "no pod runs" in c["Suspended"]["message"]
    assert c["Ready"]["reason"] == c["DispatcherReady"]["reason"] == c["WorkersReady"]["reason"] == "Suspended"
    assert stopping["dispatcherAddress"] == "grpc://demo-dispatcher.ml.svc.cluster.local:5050"
    resumed = status.compute_status(
        parse(),
        {**body(), "status": stopping},
        status.Servers(sts(1, 1), sts(2, 2)),
        SETTINGS,
        "T2",
    )
    c = conditions(resumed)
    assert (c["Suspended"]["status"], c["Suspended"]["reason"]) == ("False", "Resumed")
    assert c["Ready"]["status"] == "True"


NOT_READY = (
    "The dispatcher pod is not ready yet (starting, replaying its journal, or unable to run: "
    "see `kubectl describe pod` of the dispatcher)."
)
SERVES = "The tf.data service is ready: the dispatcher and all workers serve."
RESTARTING = "The dispatcher is restarting with a new configuration."


def triples(st: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) in the order the status lists them, as `kubectl get -o yaml` shows."""
    return [(c["type"], c["status"], c["reason"], c["message"]) for c in st["conditions"]]


def test_every_situation_has_its_conditions_word_for_word() -> None:
    svc = parse()
    restarting = sts(1, 0, "r1", "r2")
    not_updated = {**sts(1, 0), "status": {**sts(1, 0)["status"], "updatedReplicas": 0}}
    rolling = sts(2, 2, "r1", "r2")
    cases = [
        (status.Servers(None, None), None, [
            ("Ready", "False", "DispatcherMissing", "The dispatcher StatefulSet does not exist yet."),
            ("DispatcherReady", "False", "DispatcherMissing", "The dispatcher StatefulSet does not exist yet."),
            ("WorkersReady", "False", "WorkersMissing", "The worker StatefulSet does not exist yet."),
        ]),
        (status.Servers(sts(1, 1), sts(2, 2)), None, [
            ("Ready", "True", "Ready", SERVES),
            ("DispatcherReady", "True", "DispatcherReady", "The dispatcher serves requests."),
            ("WorkersReady", "True", "WorkersReady", "2/2 workers are ready."),
        ]),
        (status.Servers(restarting, sts(2, 2)), None, [
            ("Ready", "False", "DispatcherRestarting", RESTARTING),
            ("DispatcherReady", "False", "DispatcherRestarting", RESTARTING),
            ("WorkersReady", "True", "WorkersReady", "2/2 workers are ready."),
        ]),
        (status.Servers(not_updated, sts(2, 2)), None, [
            ("Ready", "False", "DispatcherRestarting", RESTARTING),
            ("DispatcherReady", "False", "DispatcherRestarting", RESTARTING),
            ("WorkersReady", "True", "WorkersReady", "2/2 workers are ready."),
        ]),
        (status.Servers(sts(1, 0), rolling), None, [
            ("Ready", "False", "DispatcherNotReady", NOT_READY),
            ("DispatcherReady", "False", "DispatcherNotReady", NOT_READY),
            ("WorkersReady", "False", "WorkersNotReady", "2/2 workers are ready and up to date."),
        ]),
        (status.Servers(sts(1, 1), sts(3, 3)), None, [  # 3 running, 2 wanted
            ("Ready", "False", "WorkersNotReady", "3/2 workers are ready and up to date."),
            ("DispatcherReady", "True", "DispatcherReady", "The dispatcher serves requests."),
            ("WorkersReady", "False", "WorkersNotReady", "3/2 workers are ready and up to date."),
        ]),
        (status.Servers(sts(1, 1), sts(2, 2)), "Scaling up: waiting", [
            ("Ready", "False", "Scaling", "Scaling up: waiting"),
            ("DispatcherReady", "True", "DispatcherReady", "The dispatcher serves requests."),
            ("WorkersReady", "False", "Scaling", "Scaling up: waiting"),
        ]),
    ]  # fmt: skip
    for observed, waiting, expected in cases:
        st = status.compute_status(svc, body(generation=3), observed, SETTINGS, "T", waiting=waiting)
        assert triples(st) == expected, observed
        assert {c["observedGeneration"] for c in st["conditions"]} == {3} and st["observedGeneration"] == 3
        assert {c["lastTransitionTime"] for c in st["conditions"]} == {"T"}


def stopped(spec_replicas: int, pods: int | None) -> dict[str, Any]:
    """A StatefulSet scaled to ``spec_replicas`` with ``pods`` still there (None: Kubernetes left the
    zero out of the status)."""
    return {"metadata": {"generation": 2}, "spec": {"replicas": spec_replicas},
            "status": {"observedGeneration": 2} | ({} if pods is None else {"replicas": pods})}  # fmt: skip


KEPT = "Its Services, address (grpc://demo-dispatcher.ml.svc.cluster.local:5050), journal claim and configuration stay"
SUSPEND_HELD = hold.HoldDecision(hold.HOLD, hold.Pending("suspend", "suspend", 2), "suspend waits: a client reads")


def test_every_suspend_situation_has_its_conditions_word_for_word() -> None:
    suspended, running = parse(suspend=True), parse()
    was_suspended = {"conditions": [{"type": "Suspended", "status": "True"}]}
    off_dispatcher = "The service is suspended: no dispatcher runs."
    off_workers = "The service is suspended: no worker runs."
    stopping = f"The service is suspended: 3 pod(s) are still stopping. {KEPT}; set spec.suspend: false to resume it."
    gone = f"The service is suspended: no pod runs. {KEPT}; set spec.suspend: false to resume it."
    resumed = "The service was resumed: spec.suspend is false."
    cases = [
        (suspended, {}, status.Servers(stopped(0, 1), stopped(0, 2)), None, [
            ("Ready", "False", "Suspended", stopping),
            ("DispatcherReady", "False", "Suspended", off_dispatcher),
            ("WorkersReady", "False", "Suspended", off_workers),
            ("Suspended", "True", "Suspended", stopping),
        ]),
        (suspended, {}, status.Servers(stopped(0, None), stopped(0, None)), None, [
            ("Ready", "False", "Suspended", gone),
            ("DispatcherReady", "False", "Suspended", off_dispatcher),
            ("WorkersReady", "False", "Suspended", off_workers),
            ("Suspended", "True", "Suspended", gone),
        ]),
        (suspended, {}, status.Servers(sts(1, 1), sts(2, 2)), SUSPEND_HELD, [
            ("Ready", "False", "SuspendHeld", "suspend waits: a client reads"),
            ("DispatcherReady", "True", "DispatcherReady", "The dispatcher serves requests."),
            ("WorkersReady", "True", "WorkersReady", "2/2 workers are ready."),
            ("Suspended", "False", "SuspendHeld", "suspend waits: a client reads"),
        ]),
        (running, was_suspended, status.Servers(sts(1, 1), sts(2, 2)), None, [
            ("Ready", "True", "Ready", SERVES),
            ("DispatcherReady", "True", "DispatcherReady", "The dispatcher serves requests."),
            ("WorkersReady", "True", "WorkersReady", "2/2 workers are ready."),
            ("Suspended", "False", "Resumed", resumed),
        ]),
    ]  # fmt: skip
    for svc, old, observed, decision, expected in cases:
        st = status.compute_status(svc, {**body(), "status": old}, observed, SETTINGS, "T", decision=decision)
        assert triples(st) == expected, observed


def test_an_unparsable_spec_keeps_what_the_status_said_and_counts_what_runs() -> None:
    before = {"dispatcherAddress": "grpc://demo-dispatcher.ml.svc.cluster.local:5050", "selector": "x=y"}
    invalid = {**body(workers={"replicas": 4}), "status": before}
    st = status.compute_status(None, invalid, status.Servers(sts(1, 1), sts(2, 1)), SETTINGS, "T", invalid="bad: x")
    assert triples(st) == [
        ("Ready", "False", "InvalidSpec", "bad: x"),
        ("DispatcherReady", "True", "DispatcherReady", "The dispatcher serves requests."),
        ("WorkersReady", "False", "InvalidSpec", "The spec is invalid; see the Ready condition."),
    ]
    assert st["workers"] == {"replicas": 2, "readyReplicas": 1, "summary": "1/4", "desired": 4, "current": 2}
    assert (st["dispatcherAddress"], st["selector"]) == (before["dispatcherAddress"], "x=y")
    conflict = status.compute_status(
        None, body(), status.Servers(None, None), SETTINGS, "T", invalid="taken", reason=reasons.NAME_CONFLICT
    )
    assert triples(conflict)[0] == ("Ready", "False", "NameConflict", "taken")
    assert conflict["workers"] == {"replicas": 0, "readyReplicas": 0, "summary": "0/0", "desired": 0, "current": 0}
    assert conflict["observedGeneration"] == 1


def test_a_condition_that_keeps_its_status_keeps_its_transition_time_even_when_it_had_none() -> None:
    old: list[Mapping[str, Any]] = [
        {"type": "Ready", "status": "True"},
        {"type": "WorkersReady", "status": "True", "lastTransitionTime": "T0"},
    ]
    merged = status.merge_conditions(
        old, [status.Condition("Ready", True, "Ready", "m"), status.Condition("WorkersReady", True, "R", "m")], 7, "T1"
    )
    assert [(c["lastTransitionTime"], c["observedGeneration"]) for c in merged] == [("T1", 7), ("T0", 7)]


def test_status_differs_only_where_a_merge_patch_would_change_something() -> None:
    assert status.status_differs(None, {"a": 1})
    assert not status.status_differs({"a": 1, "b": 2}, {"a": 1})
    assert status.status_differs({"a": {"b": 1}}, {"a": {"b": 2}})
    assert not status.status_differs({"a": {"b": 1, "c": 3}}, {"a": {"b": 1}})
    assert status.status_differs({"a": 1}, {"a": {"b": 1}})


def test_fields_kubernetes_leaves_out_read_as_their_defaults() -> None:
    svc = parse()
    no_generation = status.compute_status(svc, {}, status.Servers(None, None), SETTINGS, "T")
    assert no_generation["observedGeneration"] == 0
    assert (
        status.compute_status(svc, {"metadata": {}}, status.Servers(None, None), SETTINGS, "T")["observedGeneration"]
        == 0
    )
    unparsed = status.compute_status(None, {"metadata": {}}, status.Servers(None, None), SETTINGS, "T", invalid="x")
    assert unparsed["workers"]["summary"] == "0/0"
    # A worker StatefulSet without spec or readyReplicas, a dispatcher without updatedReplicas:
    bare = {"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2}}
    st = status.compute_status(svc, body(), status.Servers(sts(1, 1), bare), SETTINGS, "T")
    assert conditions(st)["WorkersReady"]["message"] == "0/2 workers are ready and up to date."
    no_spec = {k: v for k, v in sts(2, 2).items() if k != "spec"}
    st = status.compute_status(svc, body(), status.Servers(sts(1, 1), no_spec), SETTINGS, "T")
    assert conditions(st)["WorkersReady"]["reason"] == "WorkersNotReady"
    dispatcher = sts(1, 0)
    del dispatcher["status"]["updatedReplicas"]
    st = status.compute_status(svc, body(), status.Servers(dispatcher, sts(2, 2)), SETTINGS, "T")
    assert conditions(st)["DispatcherReady"]["reason"] == "DispatcherRestarting"


def test_a_lost_dispatcher_node_is_said_at_once_while_its_statefulset_still_counts_the_pod_ready() -> None:
    """The node lifecycle controller marks the pod not ready before the StatefulSet controller counts
    again: the condition says DispatcherNodeLost from the first reconcile (its Warning is sent once)."""
    lost = Finding(reasons.DISPATCHER_NODE_LOST, "pod d-0: its node n1 has been unreachable since T")
    servers = status.Servers(sts(1, 1), sts(2, 2), dispatcher_problem=lost)
    said = conditions(status.compute_status(parse(), body(), servers, SETTINGS, "T1"))
    assert (said["DispatcherReady"]["status"], said["DispatcherReady"]["reason"]) == ("False", "DispatcherNodeLost")
    assert said["Ready"]["status"] == "False"


def test_a_worker_kept_for_a_snapshot_is_said_while_its_statefulset_still_counts_the_pod_ready() -> None:
    """A worker on an unreachable node, kept while a snapshot is written: WorkersReady says KeptForSnapshot
    even where the StatefulSet has not counted again (its Warning is sent once, on that reason)."""
    kept = Finding(reasons.KEPT_FOR_SNAPSHOT, "pod w-1: its node n1 has been unreachable since T, but ...")
    servers = status.Servers(sts(1, 1), sts(2, 2), workers_problem=kept)
    said = conditions(status.compute_status(parse(), body(), servers, SETTINGS, "T1"))
    assert (said["WorkersReady"]["status"], said["WorkersReady"]["reason"]) == ("False", "KeptForSnapshot")
    assert said["Ready"]["status"] == "False"


# --- Kueue: while it lets no pod run, every condition says so ---------------------------------------

EVICTED = (
    "Kueue evicted Workload tfdataservice-demo-1a2b3 (Preempted: to admit a higher priority Workload): every pod "
    "stops; the Services, address and journal claim stay, and the service starts again on its journal when Kueue "
    "admits it again."
)


@pytest.mark.parametrize(
    ("reason", "message", "observed", "old", "kept"),
    [
        (reasons.KUEUE_QUEUED, "Workload tfdataservice-demo-1a2b3 waits for quota in LocalQueue team-a.",
         status.Servers(None, None), {}, []),
        (reasons.KUEUE_EVICTED, EVICTED, status.Servers(sts(1, 1), sts(2, 2)), {}, []),
        # A service suspended once keeps its Suspended condition: Kueue's gate is not the user's suspend.
        (reasons.KUEUE_QUEUED, "Workload tfdataservice-demo-1a2b3 waits for quota in LocalQueue team-a.",
         status.Servers(stopped(0, None), stopped(0, None)), {"conditions": [{"type": "Suspended", "status": "True"}]},
         [("Suspended", "False", "Resumed", "The service was resumed: spec.suspend is false.")]),
    ],
)  # fmt: skip
def test_a_service_kueue_does_not_admit_says_why_in_every_condition(
    reason: str, message: str, observed: status.Servers, old: dict[str, Any], kept: list[tuple[str, ...]]
) -> None:
    queued = status.Condition(reasons.READY, False, reason, message)
    st = status.compute_status(parse(), {**body(), "status": old}, observed, SETTINGS, "T", queued=queued)
    assert triples(st) == [
        ("Ready", "False", reason, message),
        ("DispatcherReady", "False", reason, "Not admitted by Kueue: no dispatcher runs."),
        ("WorkersReady", "False", reason, "Not admitted by Kueue: no worker runs."),
        *kept,
    ]


def test_an_invalid_spec_is_said_before_kueues_queue() -> None:
    queued = status.Condition(reasons.READY, False, reasons.KUEUE_QUEUED, "Workload w waits for quota.")
    st = status.compute_status(
        parse(), body(), status.Servers(None, None), SETTINGS, "T", invalid="bad: x", queued=queued
    )
    assert triples(st)[0] == ("Ready", "False", "InvalidSpec", "bad: x")


# --- Drains: readers that hold the workers' budget show in WorkersReady and status.drains ------------

READERS_HOLD = "Drains wait: a client reads this static service."
UNKNOWN_HOLDS = "Drains wait: whether a client reads this static service is unknown."
FORCED = "Drains go ahead although a client reads: they waited rescaleMaxWaitSeconds (600 s)."


def test_drains_held_by_readers_are_said_in_workers_ready_and_remembered_since_they_began() -> None:
    svc, servers = parse(shardingPolicy="FILE"), status.Servers(sts(1, 1), sts(2, 2))

    def later(before: dict[str, Any], now: str, drains: drain.DrainDecision | None) -> dict[str, Any]:
        return status.compute_status(svc, {**body(), "status": before}, servers, SETTINGS, now, drains=drains)

    held = later({}, "T1", drain.DrainDecision(0, READERS_HOLD, waiting=True))
    assert triples(held) == [
        ("Ready", "True", "Ready", SERVES),
        ("DispatcherReady", "True", "DispatcherReady", "The dispatcher serves requests."),
        ("WorkersReady", "True", "WorkersReady", f"2/2 workers are ready. {READERS_HOLD}"),
    ]
    assert held["drains"] == {"maxUnavailable": 0, "since": "T1", "unreadableSince": None, "message": READERS_HOLD}
    # What holds them can no longer be read: since when is kept apart, and kept while it lasts.
    unknown = later(held, "T2", drain.DrainDecision(0, UNKNOWN_HOLDS, waiting=True, unreadable=True))
    assert unknown["drains"] == {"maxUnavailable": 0, "since": "T1", "unreadableSince": "T2", "message": UNKNOWN_HOLDS}
    still = later(unknown, "T3", drain.DrainDecision(0, UNKNOWN_HOLDS, waiting=True, unreadable=True))
    assert still["drains"] == unknown["drains"]
    # Read again: only the wait remains.
    read = later(still, "T4", drain.DrainDecision(0, READERS_HOLD, waiting=True))
    assert read["drains"] == held["drains"]
    # Past the wait drains go ahead: status.drains still says since when, WorkersReady no longer waits.
    forced = later(read, "T5", drain.DrainDecision(1, FORCED, waiting=True, forced=True))
    assert forced["drains"] == {"maxUnavailable": 1, "since": "T1", "unreadableSince": None, "message": FORCED}
    assert conditions(forced)["WorkersReady"]["message"] == "2/2 workers are ready."
    assert later(forced, "T6", drain.DrainDecision(1))["drains"] is None
