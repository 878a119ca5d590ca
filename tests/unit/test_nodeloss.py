"""spec.nodeLoss: which pods on a lost node are replaced, when, how, and what the status says meanwhile
(plan/nodeloss.py), and what the reconcile sends for it (controller/reconcile.py's replace_lost_pods)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tfdata_operator.controller import reconcile
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.plan import nodeloss

from cases import parse
from fixtures.fakes import Clock, FakeApi, service

Manifest = dict[str, Any]
NOW = datetime(2026, 11, 27, 10, 0, 0, tzinfo=timezone.utc)
CONFIG = OperatorConfig(server_image="tfdata-server:test")


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str = "node-a", ready: str = "Unknown", taint: str | None = nodeloss.UNREACHABLE_TAINT,
         tainted_ago: float = 120) -> Manifest:  # fmt: skip
    taints = [
        {"key": taint, "effect": effect, "timeAdded": stamp(tainted_ago)} for effect in ("NoSchedule", "NoExecute")
    ]
    return {
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": taints if taint else []},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def pod(name: str, on: str = "node-a", ready: bool = False) -> Manifest:
    """A pod as the operator's cache keeps it (of its spec, only its node)."""
    component = "dispatcher" if "dispatcher" in name else "worker"
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "labels": {"app.kubernetes.io/component": component}},
        "spec": {"nodeName": on},
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }  # fmt: skip


LOCAL_PATH_PV = {
    "spec": {
        "hostPath": None,
        "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}]}},
    }
}  # fmt: skip
ZONAL_PV = {
    "spec": {
        "csi": {"driver": "pd.csi.storage.gke.io"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]}]}},
    }
}  # fmt: skip


# --- Which node counts as lost ------------------------------------------------------------------

NODES = [
    ("ready-node-with-a-stale-taint", node(ready="True"), None),
    ("not-ready-taint: the kubelet answers", node(ready="False", taint="node.kubernetes.io/not-ready"), None),
    ("no-taint-yet", node(taint=None), None),
    ("unreachable", node(tainted_ago=30), stamp(30)),
    ("node-gone: PodGC's", None, None),
]


@pytest.mark.parametrize(("case", "read", "since"), NODES, ids=[c[0] for c in NODES])
def test_only_a_node_kubernetes_tainted_unreachable_counts_as_lost(
    case: str, read: Manifest | None, since: str | None
) -> None:
    found = nodeloss.unreachable_since(read)
    assert (found.strftime("%Y-%m-%dT%H:%M:%SZ") if found else None) == since


def test_only_the_nodes_of_unready_scheduled_pods_are_read() -> None:
    assert nodeloss.node_to_read(pod("demo-worker-0", ready=False)) == "node-a"
    assert nodeloss.node_to_read(pod("demo-worker-0", ready=True)) is None
    assert nodeloss.node_to_read({**pod("demo-worker-0"), "spec": {}}) is None  # not scheduled


# --- Whether the journal's volume is reachable only from the lost node -----------------------------

VOLUMES = [
    ("local-path (hostname affinity)", LOCAL_PATH_PV, True),
    ("local volume", {"spec": {"local": {"path": "/mnt/disk"}}}, True),
    ("hostPath", {"spec": {"hostPath": {"path": "/data"}}}, True),
    ("zonal disk", ZONAL_PV, False),
    ("nfs (RWX)", {"spec": {"nfs": {"server": "nfs", "path": "/"}, "accessModes": ["ReadWriteMany"]}}, False),
    ("pinned to two nodes", {"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a", "node-b"]}]}]}}}}, False),
    ("unreadable", None, False),
]  # fmt: skip


@pytest.mark.parametrize(("case", "pv", "local"), VOLUMES, ids=[c[0] for c in VOLUMES])
def test_a_volume_is_node_local_only_when_no_other_node_can_reach_it(
    case: str, pv: Manifest | None, local: bool
) -> None:
    assert nodeloss.node_local(pv, "node-a") is local


# --- The rule -------------------------------------------------------------------------------------

# (case, spec.nodeLoss, pod, seconds unreachable, journal node-local) -> (event reason, claim deleted,
# dispatcher's finding, workers' finding, requeue)
RULES = [
    ("worker, before the time", {}, "demo-worker-1", 20, False, (None, None, None, "NodeUnreachable", 40.0)),
    ("worker, after the time", {}, "demo-worker-1", 60, False,
     ("ReplacedLostPod", None, None, "ReplacedLostPod", None)),
    ("worker, replaceAfterSeconds 0", {"replaceAfterSeconds": 0}, "demo-worker-1", 0, False,
     ("ReplacedLostPod", None, None, "ReplacedLostPod", None)),
    ("worker, longer setting", {"replaceAfterSeconds": 600}, "demo-worker-1", 120, False,
     (None, None, None, "NodeUnreachable", 480.0)),
    ("dispatcher, shared journal", {}, "demo-dispatcher-0", 90, False,
     ("ReplacedLostPod", None, "ReplacedLostPod", None, None)),
    ("dispatcher, node-local journal", {}, "demo-dispatcher-0", 90, True,
     ("JournalLost", "journal-demo-dispatcher-0", "JournalLost", None, None)),
    ("dispatcher, before the time", {}, "demo-dispatcher-0", 10, True, (None, None, "NodeUnreachable", None, 50.0)),
    ("dispatcher, Wait", {"dispatcher": "Wait"}, "demo-dispatcher-0", 900, True,
     (None, None, "DispatcherNodeLost", None, None)),
    ("worker, with dispatcher Wait", {"dispatcher": "Wait"}, "demo-worker-0", 900, False,
     ("ReplacedLostPod", None, None, "ReplacedLostPod", None)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "setting", "name", "lost_for", "local", "expected"), RULES, ids=[r[0] for r in RULES])
def test_the_rule(
    case: str, setting: dict[str, Any], name: str, lost_for: float, local: bool, expected: tuple[Any, ...]
) -> None:
    svc = parse(shardingPolicy="DYNAMIC", nodeLoss=setting)
    lost = nodeloss.lost_pods([pod(name)], {"node-a": node(tainted_ago=lost_for)})
    decided = nodeloss.decide(svc, lost, local, NOW)
    reason, claim, dispatcher, workers, requeue = expected
    assert [r.reason for r in decided.replace] == ([reason] if reason else [])
    assert [r.claim for r in decided.replace] == ([claim] if reason else [])
    assert (decided.dispatcher.reason if decided.dispatcher else None) == dispatcher
    assert (decided.workers.reason if decided.workers else None) == workers
    assert decided.requeue_after == requeue


def test_what_a_person_reads() -> None:
    """The Events and conditions, sentence by sentence: what happened, why, and what to do."""
    svc = parse(shardingPolicy="DYNAMIC")
    dispatcher = pod("demo-dispatcher-0")
    lost = nodeloss.lost_pods([dispatcher, pod("demo-worker-0")], {"node-a": node(tainted_ago=75)})
    decided = nodeloss.decide(svc, lost, True, NOW)
    assert [(r.event_type, r.message) for r in decided.replace] == [
        ("Warning", "Deleted the dispatcher pod demo-dispatcher-0 at once: its node node-a has been unreachable since "
         "2026-11-27T09:58:45Z (over spec.nodeLoss.replaceAfterSeconds, 60). Its journal claim "
         "journal-demo-dispatcher-0 was deleted too: its volume is reachable only from that node. The new "
         "dispatcher starts elsewhere on a fresh journal: the jobs that were running are lost, and clients must "
         "start new ones."),
        ("Normal", "Deleted pod demo-worker-0 at once: its node node-a has been unreachable since 2026-11-27T09:58:45Z "
         "(over spec.nodeLoss.replaceAfterSeconds, 60); its StatefulSet recreates it on another node"),
    ]  # fmt: skip
    shared = nodeloss.decide(svc, lost[:1], False, NOW).replace[0].message
    assert shared.endswith("replays its journal, which other nodes reach: the running jobs go on.")
    # A journal on gs:// (no claim): the dispatcher replays it elsewhere.
    on_gcs = parse(shardingPolicy="DYNAMIC", dispatcher={"workDir": "gs://bucket/j", "storage": {"enabled": False}})
    assert nodeloss.journal_claim(on_gcs, dispatcher) is None
    assert nodeloss.decide(on_gcs, lost[:1], True, NOW).replace[0].reason == "ReplacedLostPod"
    without_journal = parse(shardingPolicy="DYNAMIC", dispatcher={"faultTolerantMode": False})
    assert (
        "the jobs that were running are lost"
        in nodeloss.decide(without_journal, lost[:1], False, NOW).replace[0].message
    )
    early = nodeloss.decide(
        svc, nodeloss.lost_pods([pod("demo-worker-0")], {"node-a": node(tainted_ago=15)}), False, NOW
    )
    assert early.workers is not None and early.workers.message == (
        "pod demo-worker-0: its node node-a has been unreachable since 2026-11-27T09:59:45Z; it is replaced at "
        "2026-11-27T10:00:45Z (spec.nodeLoss.replaceAfterSeconds 60)"
    )
    wait = nodeloss.decide(parse(shardingPolicy="DYNAMIC", nodeLoss={"dispatcher": "Wait"}), lost[:1], True, NOW)
    assert wait.dispatcher is not None and "kubectl delete pod demo-dispatcher-0 --force --grace-period=0" in (
        wait.dispatcher.message
    )


def test_the_spec_defaults_to_recover_after_a_minute() -> None:
    svc = parse(shardingPolicy="DYNAMIC")
    assert (svc.node_loss.replace_after_seconds, svc.node_loss.dispatcher) == (60, "Recover")


# --- The reconcile: what it reads and sends ---------------------------------------------------------


def reconcile_with(api: FakeApi, body: Manifest, pods: list[Manifest]) -> reconcile.Outcome:
    for p in pods:
        p["metadata"]["ownerReferences"] = []
    observed = reconcile.Observed(api.observed().objects, pods)
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed)


def started(api: FakeApi, body: Manifest) -> None:
    reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, api.observed())
    api.take_calls()


def with_node(api: FakeApi, seconds_ago: float) -> None:
    taint_at = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    lost = node()
    for taint in lost["spec"]["taints"]:
        taint["timeAdded"] = taint_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    api.objects[("Node", "node-a")] = lost


def test_ready_pods_cost_no_read_and_a_lost_worker_is_force_deleted_once_due() -> None:
    api, body = FakeApi(), service()
    started(api, body)
    ready = [pod("demo-dispatcher-0", ready=True), pod("demo-worker-0", ready=True)]
    reconcile_with(api, body, ready)
    assert not [c for c in api.take_calls() if c[0] in ("get", "force-delete")]

    with_node(api, 30)
    lost = pod("demo-worker-1")
    outcome = reconcile_with(api, body, [*ready, lost])
    assert [c for c in api.take_calls() if c[0] != "status"] == [("get", "Node/node-a")]
    assert outcome.requeue_after is not None and 25 <= outcome.requeue_after <= 31

    with_node(api, 61)
    api.objects[("Pod", "demo-worker-1")] = lost
    reconcile_with(api, body, [*ready, lost])
    assert [c for c in api.take_calls() if c[0] != "status"] == [
        ("get", "Node/node-a"),
        ("force-delete", "Pod/demo-worker-1"),
        ("event", "ReplacedLostPod"),
    ]


def test_a_dispatcher_on_a_local_path_volume_loses_its_claim_first_and_with_wait_nothing_is_deleted() -> None:
    api, body = FakeApi(), service()
    started(api, body)
    with_node(api, 120)
    claim = "journal-demo-dispatcher-0"
    api.objects[("PersistentVolumeClaim", claim)] = {"metadata": {"name": claim}, "spec": {"volumeName": "pv-1"}}
    api.objects[("PersistentVolume", "pv-1")] = LOCAL_PATH_PV
    api.objects[("Pod", "demo-dispatcher-0")] = dispatcher = pod("demo-dispatcher-0")
    reconcile_with(api, body, [dispatcher])
    calls = [c for c in api.take_calls() if c[0] != "status"]
    assert calls == [
        ("get", "Node/node-a"),
        ("get", f"PersistentVolumeClaim/{claim}"),
        ("get", "PersistentVolume/pv-1"),
        ("delete", f"PersistentVolumeClaim/{claim}"),
        ("force-delete", "Pod/demo-dispatcher-0"),
        ("event", "JournalLost"),
    ]
    assert api.events[-1][0] == "Warning" and "the jobs that were running are lost" in api.events[-1][2]
    ready = next(c for c in api.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]
    assert ready["reason"] == "JournalLost" and "clients must start new ones" in ready["message"]

    waiting = service(nodeLoss={"dispatcher": "Wait"})
    api.objects[("Pod", "demo-dispatcher-0")] = dispatcher
    reconcile_with(api, waiting, [dispatcher])
    assert [c for c in api.take_calls() if c[0] != "status"] == [
        ("get", "Node/node-a"),
        ("event", "DispatcherNodeLost"),
    ]
    ready = next(c for c in api.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]
    assert ready["status"] == "False" and ready["reason"] == "DispatcherNodeLost"
    assert "spec.nodeLoss.dispatcher is Wait" in ready["message"]
    reconcile_with(api, waiting, [dispatcher])  # said once
    assert [c for c in api.take_calls() if c[0] != "status"] == [("get", "Node/node-a")]


def test_the_workers_of_a_replaced_dispatcher_restart_to_reach_the_new_one() -> None:
    """Their heartbeats went to the lost dispatcher's silent address; a worker on the lost node is
    force-deleted as lost, the others are restarted (and nothing happens to them while it waits)."""
    api, body = FakeApi(), service()
    started(api, body)
    with_node(api, 120)
    api.objects[("Node", "node-b")] = node("node-b", ready="True", taint=None)
    lost_dispatcher, lost_worker = pod("demo-dispatcher-0"), pod("demo-worker-0")
    healthy = pod("demo-worker-1", on="node-b", ready=True)
    for one in (lost_dispatcher, lost_worker, healthy):
        api.objects[("Pod", one["metadata"]["name"])] = one
    reconcile_with(api, body, [lost_dispatcher, lost_worker, healthy])
    calls = [c for c in api.take_calls() if c[0] in ("delete", "force-delete", "event")]
    assert calls == [
        ("force-delete", "Pod/demo-dispatcher-0"),
        ("event", "ReplacedLostPod"),
        ("force-delete", "Pod/demo-worker-0"),
        ("event", "ReplacedLostPod"),
        ("delete", "Pod/demo-worker-1"),
        ("event", "RestartedStaleWorker"),
    ], calls
    assert "would not reach the new one" in api.events[-1][2]

    decision = nodeloss.NodeLoss(replace=[nodeloss.Replacement(lost_worker, "ReplacedLostPod", "m")])
    assert nodeloss.stranded_workers(decision, "demo-dispatcher-0", [lost_worker, healthy]) == []
    going = {**healthy, "metadata": {**healthy["metadata"], "deletionTimestamp": stamp(1)}}
    with_dispatcher = nodeloss.NodeLoss(replace=[nodeloss.Replacement(lost_dispatcher, "ReplacedLostPod", "m")])
    assert nodeloss.stranded_workers(with_dispatcher, "demo-dispatcher-0", [going]) == []


def test_the_pods_of_one_lost_node_cost_one_read_of_it_per_five_seconds() -> None:
    """Every event of a lost node's pods queues a reconcile: the Node is read once for all of them,
    and again only after NODE_READ_SECONDS (the pods' own watch brings the next change)."""
    api, body = FakeApi(), service()
    started(api, body)
    with_node(api, 20)
    clock = Clock()
    readers = reconcile.Autoscaling(clock=clock)
    lost = [pod("demo-worker-0"), pod("demo-worker-1"), pod("demo-dispatcher-0")]
    observed = reconcile.Observed(api.observed().objects, lost)

    def reads() -> int:
        return sum(1 for call in api.take_calls() if call == ("get", "Node/node-a"))

    for _ in range(3):
        reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)
    assert reads() == 1
    clock.now += reconcile.NODE_READ_SECONDS
    reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)
    assert reads() == 1
