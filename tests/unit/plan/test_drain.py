"""The workers' disruption budget: a drain waits while a client reads a static service (or nobody knows)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tfdata_operator.api import reasons, spec
from tfdata_operator.controller import reconcile
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Observed
from tfdata_operator.controller.readers import Readers
from tfdata_operator.plan import drain, hold
from tfdata_operator.render import builders
from tfdata_operator.wire import snapshots as snapshotwire
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsReport

from fixtures import fakes
from fixtures.cases import parse
from fixtures.support import service_signals

NOW = datetime(2026, 11, 27, 10, 0, 0, tzinfo=timezone.utc)
STATIC = ("FILE", "DATA", "FILE_OR_DATA", "HINT")


def svc(policy: str = "FILE", **workers: Any) -> spec.ServiceSpec:
    return parse(shardingPolicy=policy, workers={"replicas": 3, **workers})


READING = service_signals(True, reasons=("1 clients attached to jobs",))
IDLE = service_signals(False, idle_seconds=hold.QUIET_SECONDS + 4)
QUIETING = service_signals(False, idle_seconds=hold.QUIET_SECONDS - 3)
UNKNOWN = hold.Unknown("GET http://10.0.0.1:8080/v1/signals failed: timed out")
SIGNALS = {"reading": READING, "quieting": QUIETING, "idle": IDLE, "unknown": UNKNOWN, "not read": None}
# What each signal makes of a static WhenIdle service's budget: readers (or nobody knows) hold drains.
HELD = {"reading": 0, "quieting": 0, "idle": 1, "unknown": 0, "not read": 0}
WAITED = {"not yet": NOW - timedelta(seconds=60), "past rescaleMaxWaitSeconds": NOW - timedelta(seconds=601)}


def expected(policy: str, rescale: str, signal: str, waited: str, max_wait: bool) -> int | None:
    """The rule, written out: "OFF" has no budget; DYNAMIC and Immediate always 1; a static WhenIdle
    service 0 while readers hold it, unless rescaleMaxWaitSeconds has passed."""
    if policy == "OFF":
        return None
    if policy == "DYNAMIC" or rescale == "Immediate":
        return 1
    if HELD[signal] == 0 and max_wait and waited == "past rescaleMaxWaitSeconds":
        return 1
    return HELD[signal]


TABLE = [
    (policy, rescale, signal, waited, max_wait)
    for policy in (*STATIC, "DYNAMIC", "OFF")
    for rescale in ("WhenIdle", "Immediate")
    for signal in SIGNALS
    for waited in WAITED
    for max_wait in (False, True)
    if not (max_wait and rescale == "Immediate")  # the spec refuses rescaleMaxWaitSeconds with Immediate
]


@pytest.mark.parametrize(("policy", "rescale", "signal", "waited", "max_wait"), TABLE)
def test_the_budget_per_policy_rescale_policy_signal_and_wait(
    policy: str, rescale: str, signal: str, waited: str, max_wait: bool
) -> None:
    fields: dict[str, Any] = {"rescalePolicy": rescale}
    if max_wait:
        fields["rescaleMaxWaitSeconds"] = 600
    service = svc(policy, **fields)
    decision = drain.decide(service, True, 3, SIGNALS[signal], WAITED[waited], NOW)
    assert decision.max_unavailable == expected(policy, rescale, signal, waited, max_wait)
    manifest = builders.build_worker_pdb(service, decision.max_unavailable or 1)
    assert (manifest is None) == (policy == "OFF")
    # The signal is read exactly when the rule depends on it.
    assert drain.needs_signal(service, True, 3) == (policy in STATIC and rescale == "WhenIdle")


@pytest.mark.parametrize("policy", [*STATIC, "DYNAMIC"])
def test_an_unready_worker_never_blocks_a_drain(policy: str) -> None:
    for budget in (0, 1):
        pdb = builders.build_worker_pdb(svc(policy), budget)
        assert pdb is not None
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert pdb["spec"]["maxUnavailable"] == budget


@pytest.mark.parametrize(("running", "workers"), [(False, 3), (True, 0)])
def test_without_a_dispatcher_or_workers_nobody_reads_and_the_signal_is_not_read(running: bool, workers: int) -> None:
    assert not drain.needs_signal(svc(), running, workers)
    decision = drain.decide(svc(), running, workers, None, None, NOW)
    assert decision.max_unavailable == 1 and not decision.waiting


def test_the_message_says_why_drains_wait_when_they_go_ahead_and_how_to_let_them_go() -> None:
    decision = drain.decide(svc(rescaleMaxWaitSeconds=600), True, 3, READING, NOW - timedelta(seconds=60), NOW)
    assert decision.message == (
        "Drains wait: a client reads this static service, and a worker moved to another node would read its shard "
        "again from the start (the job would get those elements twice). They go ahead within a minute after the "
        "last reader stops, or at 2026-11-27T10:09:00Z (rescaleMaxWaitSeconds); set spec.workers.rescalePolicy: "
        "Immediate to let them go now."
    )
    assert decision.waiting and not decision.forced
    # The bound comes before the next reading: look again then.
    assert decision.requeue_after == pytest.approx(drain.RECHECK_SECONDS)
    near = drain.decide(svc(rescaleMaxWaitSeconds=600), True, 3, READING, NOW - timedelta(seconds=590), NOW)
    assert near.requeue_after == pytest.approx(10)


def test_an_unknown_signal_is_named_as_such() -> None:
    decision = drain.decide(svc(), True, 3, UNKNOWN, None, NOW)
    assert decision.max_unavailable == 0
    assert "whether a client reads this static service is unknown" in decision.message
    assert "timed out" in decision.detail  # the Event has the details, the status stays the same


def test_the_status_message_stays_the_same_while_the_budget_does() -> None:
    """Each reading of the signal may name other readers; the status (written only when it changes) does not."""
    other = service_signals(True, reasons=("3 clients attached to jobs", "2 trainers reported"))
    first = drain.decide(svc(), True, 3, READING, None, NOW)
    later = drain.decide(svc(), True, 3, other, NOW, NOW + timedelta(seconds=30))
    quieting = drain.decide(svc(), True, 3, QUIETING, NOW, NOW + timedelta(seconds=60))
    assert first.message == later.message == quieting.message
    assert first.detail != later.detail


def test_past_the_maximum_wait_drains_go_ahead_and_the_wait_is_still_remembered() -> None:
    service = svc(rescaleMaxWaitSeconds=600)
    decision = drain.decide(service, True, 3, READING, NOW - timedelta(seconds=601), NOW)
    assert (decision.max_unavailable, decision.waiting, decision.forced) == (1, True, True)
    assert "they waited rescaleMaxWaitSeconds (600 s)" in decision.message
    reason, message = drain.event(decision, "x-worker")
    assert reason == reasons.DRAINS_FORCED and reason in reasons.WARNINGS
    assert message.startswith("PodDisruptionBudget x-worker: maxUnavailable 1. Drains go ahead although")


def test_each_reading_is_kept_for_the_recheck_or_until_a_quiet_moment_is_long_enough() -> None:
    assert drain.valid_for(READING) == drain.RECHECK_SECONDS
    assert drain.valid_for(IDLE) == drain.RECHECK_SECONDS
    assert drain.valid_for(UNKNOWN) == drain.RECHECK_SECONDS
    assert drain.valid_for(QUIETING) == pytest.approx(3.0)


def test_the_events_of_a_change_of_the_budget() -> None:
    held = drain.decide(svc(), True, 3, READING, None, NOW)
    assert drain.event(held, "x-worker") == (
        reasons.DRAINS_HELD,
        f"PodDisruptionBudget x-worker: maxUnavailable 0. {held.message} (clients read from the service: "
        "1 clients attached to jobs)",
    )
    free = drain.decide(svc(), True, 3, IDLE, None, NOW)
    assert drain.event(free, "x-worker") == (
        reasons.DRAINS_ALLOWED,
        "PodDisruptionBudget x-worker: maxUnavailable 1. Drains go ahead: no client has read for 9 s.",
    )
    immediate = drain.decide(svc(rescalePolicy="Immediate"), True, 3, None, None, NOW)
    assert drain.event(immediate, "x-worker")[1].endswith("Drains go ahead: rescalePolicy Immediate.")


# --- A snapshot being written holds drains where spec.snapshots is set -----------------------------


def snapshots_svc(policy: str = "DYNAMIC", **workers: Any) -> spec.ServiceSpec:
    return parse(shardingPolicy=policy, workers={"replicas": 3, **workers}, snapshots={"directory": "gs://b"})


def report(state: str) -> SnapshotsReport:
    return SnapshotsReport((SnapshotProgress("gs://b/imagenet", state, journaled=True),), "journal")


SAVES = {
    "in progress": report(snapshotwire.IN_PROGRESS),
    "completed": report(snapshotwire.COMPLETED),
    "failed": report(snapshotwire.FAILED),
    "unknown": hold.Unknown("GET http://10.0.0.1:8080/v1/snapshots failed: timed out"),
    "not read": None,
}


@pytest.mark.parametrize("policy", ["DYNAMIC", *STATIC])
@pytest.mark.parametrize("saves", list(SAVES))
def test_a_snapshot_being_written_holds_drains_of_a_service_with_spec_snapshots(policy: str, saves: str) -> None:
    held = saves in ("in progress", "unknown", "not read")
    decision = drain.decide(snapshots_svc(policy), True, 3, IDLE, None, NOW, SAVES[saves])
    assert decision.max_unavailable == (0 if held else 1)
    assert decision.waiting is held
    if held:
        assert decision.message.startswith("Drains wait: ")
        assert "snapshot" in decision.message and "rescalePolicy: Immediate" in decision.message
    if saves == "in progress":
        assert "snapshot gs://b/imagenet is being written" in decision.message
        assert drain.event(decision, "demo-worker")[0] == reasons.DRAINS_HELD


@pytest.mark.parametrize(
    ("service", "running", "workers", "needed"),
    [
        (snapshots_svc(), True, 3, True),
        (snapshots_svc(), False, 3, False),  # no dispatcher pod runs
        (snapshots_svc(), True, 0, False),  # no worker to drain
        (snapshots_svc(rescalePolicy="Immediate"), True, 3, False),
        (snapshots_svc("OFF"), True, 3, False),  # no budget at all
        (svc("DYNAMIC"), True, 3, False),  # no spec.snapshots: the budget never reads them
    ],
)
def test_the_snapshots_are_read_for_the_budget_only_where_they_decide_it(
    service: spec.ServiceSpec, running: bool, workers: int, needed: bool
) -> None:
    assert drain.needs_snapshots(service, running, workers) is needed


def test_past_the_maximum_wait_a_snapshot_no_longer_holds_drains() -> None:
    service = snapshots_svc(rescaleMaxWaitSeconds=600)
    decision = drain.decide(service, True, 3, None, NOW - timedelta(seconds=601), NOW, SAVES["in progress"])
    assert (decision.max_unavailable, decision.forced, decision.waiting) == (1, True, True)
    assert decision.message.startswith("Drains go ahead although snapshot gs://b/imagenet is being written")


# --- What cannot be read holds drains for drainUnreadableMaxWaitSeconds (an hour), not for good ---------

HOUR = timedelta(seconds=3600)
# What, with what the Warning says of it.
UNREADABLE = {
    "signal": (svc(), UNKNOWN, None, "whether a client reads is unknown (GET http://10.0.0.1:8080/v1/signals failed"),
    "snapshots": (snapshots_svc(), IDLE, SAVES["unknown"], "(GET http://10.0.0.1:8080/v1/snapshots failed: timed out)"),
    "a journaled path": (snapshots_svc(), IDLE, report(snapshotwire.UNKNOWN),
                         "snapshot gs://b/imagenet is being written (those whose files cannot be read count as"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(UNREADABLE))
def test_drains_held_by_what_cannot_be_read_go_ahead_after_an_hour_with_a_warning(what: str) -> None:
    service, signal, saves, named = UNREADABLE[what]
    assert service.workers.drain_unreadable_max_wait_seconds == 3600
    first = drain.decide(service, True, 3, signal, None, NOW, saves, cluster_max_wait=None)
    assert (first.max_unavailable, first.unreadable, first.forced) == (0, True, False)
    assert "or at 2026-11-27T11:00:00Z if it still cannot be read (spec.workers.drainUnreadableMaxWaitSeconds)" in (
        first.message
    )
    assert first.requeue_after is not None and first.requeue_after <= drain.RECHECK_SECONDS
    almost = drain.decide(service, True, 3, signal, NOW - HOUR, NOW - timedelta(seconds=1), saves, NOW - HOUR, None)
    assert (almost.max_unavailable, almost.requeue_after) == (0, 1.0)
    over = drain.decide(service, True, 3, signal, NOW - HOUR, NOW, saves, NOW - HOUR, None)
    assert (over.max_unavailable, over.forced, over.waiting, over.unreadable) == (1, True, True, True)
    assert "could not be read for spec.workers.drainUnreadableMaxWaitSeconds (3600 s)" in over.message
    reason, message = drain.event(over, "demo-worker")
    assert reason == reasons.DRAINS_FORCED and reasons.DRAINS_FORCED in reasons.WARNINGS
    assert named in message, message


def test_readers_the_operator_sees_hold_drains_as_long_as_they_read_whatever_the_unreadable_bound() -> None:
    decision = drain.decide(svc(), True, 3, READING, NOW - 10 * HOUR, NOW, None, NOW - 10 * HOUR, None)
    assert (decision.max_unavailable, decision.unreadable) == (0, False)
    saving = SAVES["in progress"]
    writing = drain.decide(snapshots_svc(), True, 3, IDLE, NOW - 10 * HOUR, NOW, saving, NOW - HOUR, None)
    assert (writing.max_unavailable, writing.unreadable) == (0, False)
    shorter = svc(drainUnreadableMaxWaitSeconds=60)
    decided = drain.decide(shorter, True, 3, UNKNOWN, None, NOW, None, NOW - timedelta(seconds=60))
    assert decided.max_unavailable == 1


# --- The cluster's bound: whoever installs the operator bounds every hold of a drain ------------------

HOLDERS = {
    "readers": (svc(), READING, None, "a client reads this static service"),
    "a snapshot being written": (snapshots_svc(), IDLE, SAVES["in progress"], "snapshot gs://b/imagenet is being"),
    "what cannot be read": (svc(drainUnreadableMaxWaitSeconds=604_800), UNKNOWN, None, "whether a client reads"),
}


@pytest.mark.parametrize("what", list(HOLDERS))
def test_no_service_holds_a_node_drain_past_the_clusters_bound(what: str) -> None:
    """A namespace's users who keep reading (or writing, or whose dispatcher never answers) hold drains for
    at most the operator's bound (an hour by default), whatever their spec says; then a Warning."""
    service, signal, saves, who = HOLDERS[what]
    assert service.workers.rescale_max_wait_seconds is None
    assert drain.CLUSTER_MAX_WAIT_SECONDS == 3600
    held = drain.decide(service, True, 3, signal, NOW - timedelta(seconds=60), NOW, saves, NOW - timedelta(seconds=60))
    assert held.max_unavailable == 0
    assert "or at 2026-11-27T10:59:00Z (this cluster's bound on a held drain, --drain-max-wait-seconds)" in (
        held.message
    ), held.message
    assert "if it still cannot be read" not in held.message  # that bound is later: it is not named
    almost = drain.decide(service, True, 3, signal, NOW - HOUR, NOW - timedelta(seconds=2), saves, NOW - HOUR)
    assert (almost.max_unavailable, almost.requeue_after) == (0, 2.0)
    over = drain.decide(service, True, 3, signal, NOW - HOUR, NOW, saves, NOW - HOUR)
    assert (over.max_unavailable, over.forced, over.waiting) == (1, True, True)
    assert over.message.startswith(f"Drains go ahead although {who}"), over.message
    assert "they waited 3600 s, the longest this cluster lets a service hold a node's drain" in over.message
    reason, message = drain.event(over, "demo-worker")
    assert reason == reasons.DRAINS_FORCED and reasons.DRAINS_FORCED in reasons.WARNINGS
    assert "(the operator's --drain-max-wait-seconds)" in message
    unbounded = drain.decide(service, True, 3, signal, NOW - 10 * HOUR, NOW, saves, NOW - HOUR, cluster_max_wait=0)
    assert unbounded.max_unavailable == 0  # 0 there: no cluster bound, as before it existed


def test_a_services_own_shorter_bound_is_named_and_ends_the_wait_first() -> None:
    service = svc(rescaleMaxWaitSeconds=600)
    held = drain.decide(service, True, 3, READING, NOW - timedelta(seconds=60), NOW, None, None, 3600)
    assert "or at 2026-11-27T10:09:00Z (rescaleMaxWaitSeconds)" in held.message
    assert "this cluster's bound" not in held.message
    over = drain.decide(service, True, 3, READING, NOW - timedelta(seconds=600), NOW, None, None, 3600)
    assert (over.max_unavailable, over.forced) == (1, True)
    assert "they waited rescaleMaxWaitSeconds (600 s)" in over.message
    longer = svc(rescaleMaxWaitSeconds=7200)
    capped = drain.decide(longer, True, 3, READING, NOW - HOUR, NOW, None, None, 3600)
    assert (capped.max_unavailable, capped.forced) == (1, True)
    assert "the longest this cluster lets a service hold a node's drain" in capped.message


def test_the_status_keeps_since_when_drains_are_held_by_what_cannot_be_read() -> None:

    api, body = fakes.FakeApi(), fakes.service(shardingPolicy="FILE", workers={"replicas": 2})
    config = OperatorConfig(server_image="tfdata-server:test")
    reconcile.reconcile(api, config, {**body, "status": api.status}, api.observed())
    pods = []
    for name in ("demo-dispatcher-0", "demo-worker-0", "demo-worker-1"):
        component = "dispatcher" if "dispatcher" in name else "worker"
        pods.append({
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "ownerReferences": [],
                         "labels": {"app.kubernetes.io/component": component, "app.kubernetes.io/instance": "demo"}},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": "Running", "podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
    readers = Readers(fetch=lambda url: "timed out", read_server_info=lambda url: None)
    observed = Observed(api.observed().objects, pods)
    reconcile.reconcile(api, config, {**body, "status": api.status}, observed, readers)
    drains = (api.status or {}).get("drains")
    assert drains is not None and drains["maxUnavailable"] == 0 and drains["unreadableSince"] == drains["since"], drains
    kept = drains["unreadableSince"]
    readers.drains = type(readers.drains)()  # read again
    reconcile.reconcile(api, config, {**body, "status": api.status}, observed, readers)
    assert (api.status or {})["drains"]["unreadableSince"] == kept
