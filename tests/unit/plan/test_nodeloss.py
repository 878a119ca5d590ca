"""spec.nodeLoss: which pods on a lost node are replaced, when, how, and what the status says meanwhile
(plan/nodeloss.py), and what the reconcile sends for it (controller/repair.py's replace_lost_pods)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tfdata_operator.controller import reconcile
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Observed, Outcome
from tfdata_operator.controller.readers import Readers
from tfdata_operator.controller.run import NODE_READ_SECONDS
from tfdata_operator.plan import nodeloss
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsReport

from fixtures.cases import parse
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


# --- Which node counts as lost, and whether that is certain -----------------------------------------

OUT = nodeloss.OUT_OF_SERVICE_TAINT
NODES = [
    ("ready-node-with-a-stale-taint", node(ready="True"), None),
    ("not-ready-taint: the kubelet answers", node(ready="False", taint="node.kubernetes.io/not-ready"), None),
    ("no-taint-yet", node(taint=None), None),
    ("unreachable: a guess", node(tainted_ago=30), (None, stamp(30))),
    ("out-of-service: certain", node(taint=OUT, tainted_ago=3), ("out-of-service", stamp(3))),
    ("out-of-service but Ready again: its kubelet handles its pods", node(ready="True", taint=OUT), None),
    ("node deleted: certain", None, ("deleted", None)),
]


@pytest.mark.parametrize(("case", "read", "expected"), NODES, ids=[c[0] for c in NODES])
def test_a_deleted_or_out_of_service_node_is_certain_and_an_unreachable_one_a_guess(
    case: str, read: Manifest | None, expected: tuple[str | None, str | None] | None
) -> None:
    found = nodeloss.node_state(read)
    if expected is None:
        assert found is None
        return
    assert found is not None
    certain, since = found
    assert (since.strftime("%Y-%m-%dT%H:%M:%SZ") if since else None) == expected[1]
    assert (certain is None) == (expected[0] is None)
    assert expected[0] is None or expected[0] in str(certain)


def test_only_the_nodes_of_unready_scheduled_pods_are_read() -> None:
    assert nodeloss.node_to_read(pod("demo-worker-0", ready=False)) == "node-a"
    assert nodeloss.node_to_read(pod("demo-worker-0", ready=True)) is None
    assert nodeloss.node_to_read({**pod("demo-worker-0"), "spec": {}}) is None  # not scheduled
    # A node that was not read (an unready pod whose node the reconcile did not ask about) is not lost.
    assert nodeloss.lost_pods([pod("demo-worker-0")], {}) == []


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


def kept(local: bool = True, retained: bool = False) -> nodeloss.Journal:
    return nodeloss.Journal("journal-demo-dispatcher-0", "uid-c", "pv-1", local, retained, "/var/local/pv-1")


# --- The rule -------------------------------------------------------------------------------------

FT_GCS = {"workDir": "gs://bucket/j", "storage": {"enabled": False}}
NO_JOURNAL = {"faultTolerantMode": False}
SAVING = "snapshot /snap/a is being written"
# (case, spec fields, pod, node (taint, seconds ago), journal as read, snapshots being written) ->
# (event reason, claim deleted, volume set to Retain, dispatcher's finding, workers' finding, requeue)
RULES = [
    # Workers: a guess, after replaceAfterSeconds; certainty at once; never a second writer of a snapshot.
    ("worker, before the time", {}, "demo-worker-1", (None, 20), None, None,
     (None, None, None, None, "NodeUnreachable", 10.0)),
    ("worker, the last seconds before the time", {}, "demo-worker-1", (None, 55), None, None,
     (None, None, None, None, "NodeUnreachable", 5.0)),
    ("worker, after the time", {}, "demo-worker-1", (None, 60), None, None,
     ("ReplacedLostPod", None, None, None, "ReplacedLostPod", None)),
    ("worker, a stored replaceAfterSeconds 0 is used as 30", {"nodeLoss": {"replaceAfterSeconds": 0}},
     "demo-worker-1", (None, 29), None, None, (None, None, None, None, "NodeUnreachable", 1.0)),
    ("worker, replaceAfterSeconds 0 after 30 s", {"nodeLoss": {"replaceAfterSeconds": 0}}, "demo-worker-1",
     (None, 30), None, None, ("ReplacedLostPod", None, None, None, "ReplacedLostPod", None)),
    ("worker, longer setting", {"nodeLoss": {"replaceAfterSeconds": 600}}, "demo-worker-1", (None, 120), None,
     None, (None, None, None, None, "NodeUnreachable", 10.0)),
    ("worker, out-of-service at once", {}, "demo-worker-1", (OUT, 0), None, None,
     ("ReplacedLostPod", None, None, None, "ReplacedLostPod", None)),
    ("worker, node deleted at once", {}, "demo-worker-1", ("deleted", 0), None, None,
     ("ReplacedLostPod", None, None, None, "ReplacedLostPod", None)),
    ("worker, due while a snapshot is written: kept", {}, "demo-worker-1", (None, 900), None, SAVING,
     (None, None, None, None, "KeptForSnapshot", 10.0)),
    ("worker, not yet due while a snapshot is written", {}, "demo-worker-1", (None, 20), None, SAVING,
     (None, None, None, None, "NodeUnreachable", 10.0)),
    ("worker, out-of-service while a snapshot is written", {}, "demo-worker-1", (OUT, 0), None, SAVING,
     ("ReplacedLostPod", None, None, None, "ReplacedLostPod", None)),
    ("worker, with dispatcher Wait", {"nodeLoss": {"dispatcher": "Wait"}}, "demo-worker-0", (None, 900), None,
     None, ("ReplacedLostPod", None, None, None, "ReplacedLostPod", None)),
    # The dispatcher on a guess: 300 s by default, then only where a returning node cannot harm its journal.
    ("dispatcher, after the workers' time, before its own", {}, "demo-dispatcher-0", (None, 120), kept(), None,
     (None, None, None, "NodeUnreachable", None, 10.0)),
    ("dispatcher, node-local journal, after 300 s: kept, Retain first", {}, "demo-dispatcher-0", (None, 300),
     kept(), None, ("JournalLost", "journal-demo-dispatcher-0", "pv-1", "JournalLost", None, None)),
    ("dispatcher, node-local journal already Retain", {}, "demo-dispatcher-0", (None, 300),
     kept(retained=True), None, ("JournalLost", "journal-demo-dispatcher-0", None, "JournalLost", None, None)),
    ("dispatcher, a shorter own setting", {"nodeLoss": {"dispatcherReplaceAfterSeconds": 30}},
     "demo-dispatcher-0", (None, 30), kept(), None,
     ("JournalLost", "journal-demo-dispatcher-0", "pv-1", "JournalLost", None, None)),
    ("dispatcher, shared journal on a guess: waits", {}, "demo-dispatcher-0", (None, 3600), kept(False), None,
     (None, None, None, "DispatcherNodeLost", None, 10.0)),
    ("dispatcher, journal not read: counts as shared", {}, "demo-dispatcher-0", (None, 3600), None, None,
     (None, None, None, "DispatcherNodeLost", None, 10.0)),
    ("dispatcher, gs:// journal on a guess: waits", {"dispatcher": FT_GCS}, "demo-dispatcher-0", (None, 3600),
     None, None, (None, None, None, "DispatcherNodeLost", None, 10.0)),
    ("dispatcher, shared journal, fencedBy named", {"nodeLoss": {"fencedBy": "our agent powers it off"}},
     "demo-dispatcher-0", (None, 300), kept(False), None,
     ("ReplacedLostPod", None, None, "ReplacedLostPod", None, None)),
    ("dispatcher, no journal", {"dispatcher": NO_JOURNAL}, "demo-dispatcher-0", (None, 300), None, None,
     ("JournalLost", None, None, "JournalLost", None, None)),
    # Certainty: at once, whatever the setting.
    ("dispatcher, shared journal, out-of-service", {}, "demo-dispatcher-0", (OUT, 0), kept(False), None,
     ("ReplacedLostPod", None, None, "ReplacedLostPod", None, None)),
    ("dispatcher, node-local journal, node deleted", {}, "demo-dispatcher-0", ("deleted", 0), kept(), None,
     ("JournalLost", "journal-demo-dispatcher-0", "pv-1", "JournalLost", None, None)),
    ("dispatcher, Wait, on a guess", {"nodeLoss": {"dispatcher": "Wait"}}, "demo-dispatcher-0", (None, 9000),
     kept(), None, (None, None, None, "DispatcherNodeLost", None, 10.0)),
    ("dispatcher, Wait, out-of-service", {"nodeLoss": {"dispatcher": "Wait"}}, "demo-dispatcher-0", (OUT, 0),
     kept(), None, ("JournalLost", "journal-demo-dispatcher-0", "pv-1", "JournalLost", None, None)),
]  # fmt: skip


def read_node(state: tuple[str | None, float]) -> Manifest | None:
    taint, ago = state
    if taint == "deleted":
        return None
    return node(taint=taint or nodeloss.UNREACHABLE_TAINT, tainted_ago=ago)


@pytest.mark.parametrize(
    ("case", "fields", "name", "state", "journal", "saving", "expected"), RULES, ids=[r[0] for r in RULES]
)
def test_the_rule(
    case: str,
    fields: dict[str, Any],
    name: str,
    state: tuple[str | None, float],
    journal: nodeloss.Journal | None,
    saving: str | None,
    expected: tuple[Any, ...],
) -> None:
    svc = parse(shardingPolicy="DYNAMIC", **fields)
    lost = nodeloss.lost_pods([pod(name)], {"node-a": read_node(state)})
    assert len(lost) == 1
    decided = nodeloss.decide(svc, lost, journal, NOW, saving)
    reason, claim, retain, dispatcher, workers, requeue = expected
    assert [r.reason for r in decided.replace] == ([reason] if reason else [])
    assert [(r.claim, r.retain) for r in decided.replace] == ([(claim, retain)] if reason else [])
    assert (decided.dispatcher.reason if decided.dispatcher else None) == dispatcher
    assert (decided.workers.reason if decided.workers else None) == workers
    assert decided.requeue_after == requeue


def test_a_worker_kept_for_a_snapshot_is_the_reason_whatever_else_waits() -> None:
    """Of two workers on lost nodes, one due and kept while a snapshot is written and one not yet due,
    in either order: the workers' reason is the wait that only certainty ends."""
    svc = parse(shardingPolicy="DYNAMIC")
    nodes = {"node-a": node(tainted_ago=900), "node-b": node("node-b", tainted_ago=20)}
    kept_one, pending = pod("demo-worker-0"), pod("demo-worker-1", on="node-b")
    for pods in ([kept_one, pending], [pending, kept_one]):
        decided = nodeloss.decide(svc, nodeloss.lost_pods(pods, nodes), None, NOW, SAVING)
        assert decided.replace == []
        assert decided.workers is not None and decided.workers.reason == "KeptForSnapshot"


def test_what_is_read_for_the_decision() -> None:
    """The journal's claim only for a dispatcher that may go now; the snapshots only for a worker due on a guess."""
    svc = parse(shardingPolicy="DYNAMIC")
    dispatcher, worker = pod("demo-dispatcher-0"), pod("demo-worker-0")

    def lost(state: tuple[str | None, float], *pods: Manifest) -> list[nodeloss.Lost]:
        return nodeloss.lost_pods(list(pods), {"node-a": read_node(state)})

    assert nodeloss.journal_to_read(svc, lost((None, 120), dispatcher), NOW) is None
    assert nodeloss.journal_to_read(svc, lost((None, 300), dispatcher), NOW) is not None
    assert nodeloss.journal_to_read(svc, lost((OUT, 0), dispatcher), NOW) is not None
    waiting = parse(shardingPolicy="DYNAMIC", nodeLoss={"dispatcher": "Wait"})
    assert nodeloss.journal_to_read(waiting, lost((None, 9000), dispatcher), NOW) is None
    assert nodeloss.journal_to_read(waiting, lost(("deleted", 0), dispatcher), NOW) is not None
    on_gcs = parse(shardingPolicy="DYNAMIC", dispatcher=FT_GCS)
    assert nodeloss.journal_to_read(on_gcs, lost((OUT, 0), dispatcher), NOW) is None  # no claim

    assert not nodeloss.needs_snapshots(svc, lost((None, 30), worker), NOW)
    assert nodeloss.needs_snapshots(svc, lost((None, 60), worker), NOW)
    assert not nodeloss.needs_snapshots(svc, lost((OUT, 0), worker), NOW)
    assert not nodeloss.needs_snapshots(svc, lost((None, 900), dispatcher), NOW)
    assert not nodeloss.needs_snapshots(parse(shardingPolicy="DYNAMIC", dispatcher=NO_JOURNAL),
                                        lost((None, 900), worker), NOW)  # fmt: skip


def test_what_a_person_reads() -> None:
    """The Events and conditions, sentence by sentence: what happened, what was certain and what guessed,
    what was kept, and what to do."""
    svc = parse(shardingPolicy="DYNAMIC")
    dispatcher = pod("demo-dispatcher-0")
    lost = nodeloss.lost_pods([dispatcher, pod("demo-worker-0")], {"node-a": node(tainted_ago=315)})
    decided = nodeloss.decide(svc, lost, kept(), NOW)
    assert [(r.event_type, r.message) for r in decided.replace] == [
        ("Warning", "Deleted the dispatcher pod demo-dispatcher-0 at once: its node node-a has been unreachable since "
         "2026-11-27T09:54:45Z (a guess: a node that is only slow looks the same) (over "
         "spec.nodeLoss.dispatcherReplaceAfterSeconds 300). Its journal claim journal-demo-dispatcher-0 was let go "
         "(only that node reaches its volume); the volume pv-1 (/var/local/pv-1 on node node-a) was first set to "
         "persistentVolumeReclaimPolicy Retain, so the old journal is kept there. The new dispatcher starts "
         "elsewhere on a fresh journal: the jobs that were running are lost, and clients must start new ones. To "
         "replay the old journal instead, see docs/operations.md, \"Recovering a kept journal\"."),
        ("Normal", "Deleted pod demo-worker-0: its node node-a has been unreachable since 2026-11-27T09:54:45Z (a "
         "guess: a node that is only slow looks the same) (over spec.nodeLoss.replaceAfterSeconds 60; a worker "
         "keeps no state, so a node that is only slow loses nothing); its StatefulSet recreates it on another "
         "node"),
    ]  # fmt: skip
    certain = nodeloss.lost_pods([dispatcher], {"node-a": node(taint=OUT, tainted_ago=2)})
    shared = nodeloss.decide(svc, certain, kept(False), NOW).replace[0].message
    assert shared == (
        "Deleted the dispatcher pod demo-dispatcher-0 at once: its node node-a is known to be off: it is tainted "
        "node.kubernetes.io/out-of-service (someone found it shut down). The new dispatcher starts on another "
        "node and replays its journal, which other nodes reach: the running jobs go on."
    )
    unfenced = nodeloss.decide(svc, lost[:1], kept(False), NOW).dispatcher
    assert unfenced is not None and unfenced.message == (
        "pod demo-dispatcher-0: its node node-a has been unreachable since 2026-11-27T09:54:45Z (a guess: a node "
        "that is only slow looks the same). Its journal is one other nodes reach, so a new dispatcher would write "
        "it while the one on that node may still be writing it, and nothing says the node is fenced: it is "
        "replaced only once the node is tainted node.kubernetes.io/out-of-service or its Node is deleted. Bring "
        "the node back; or, once you know it is off, taint it: `kubectl taint node node-a "
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`; or set spec.nodeLoss.fencedBy to say what "
        "fences such nodes."
    )
    fenced = parse(shardingPolicy="DYNAMIC", nodeLoss={"fencedBy": "STONITH powers it off in 60 s"})
    assert (
        "(spec.nodeLoss.fencedBy says the node is fenced: STONITH powers it off in 60 s): the running jobs go on"
        in (nodeloss.decide(fenced, lost[:1], kept(False), NOW).replace[0].message)
    )
    without_journal = parse(shardingPolicy="DYNAMIC", dispatcher=NO_JOURNAL)
    assert (
        "the jobs that were running are lost"
        in nodeloss.decide(without_journal, lost[:1], None, NOW).replace[0].message
    )
    early = nodeloss.decide(
        svc, nodeloss.lost_pods([pod("demo-worker-0")], {"node-a": node(tainted_ago=15)}), None, NOW
    )
    assert early.workers is not None and early.workers.message == (
        "pod demo-worker-0: its node node-a has been unreachable since 2026-11-27T09:59:45Z (a guess: a node that "
        "is only slow looks the same); it is replaced at 2026-11-27T10:00:45Z (spec.nodeLoss.replaceAfterSeconds "
        "60), or at once when the node is tainted node.kubernetes.io/out-of-service or its Node is deleted"
    )
    legacy = parse(shardingPolicy="DYNAMIC", nodeLoss={"replaceAfterSeconds": 5})
    below = nodeloss.decide(legacy, nodeloss.lost_pods([pod("demo-worker-0")], {"node-a": node(tainted_ago=15)}),
                            None, NOW).workers  # fmt: skip
    assert (
        below is not None
        and "it is replaced at 2026-11-27T10:00:15Z (spec.nodeLoss.replaceAfterSeconds 5, used "
        "as 30: no timeout is shorter than 30 s)"
        in below.message
    )
    saving = nodeloss.decide(svc, lost[1:], None, NOW, SAVING).workers
    assert saving is not None and saving.message.endswith(
        "but snapshot /snap/a is being written: a new worker would write the same stream while the one on that "
        "node may still be writing it. It is replaced once the node is tainted node.kubernetes.io/out-of-service "
        "or its Node is deleted"
    )
    wait = nodeloss.decide(parse(shardingPolicy="DYNAMIC", nodeLoss={"dispatcher": "Wait"}), lost[:1], kept(), NOW)
    assert wait.dispatcher is not None and (
        "spec.nodeLoss.dispatcher is Wait, so it is replaced only once the node is tainted "
        "node.kubernetes.io/out-of-service or its Node is deleted" in wait.dispatcher.message
    )
    assert "kubectl taint node node-a node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in (
        wait.dispatcher.message
    )


def test_the_spec_defaults_a_minute_for_workers_five_for_the_dispatcher_and_no_less_than_30_s() -> None:
    svc = parse(shardingPolicy="DYNAMIC")
    loss = svc.node_loss
    assert (loss.replace_after_seconds, loss.dispatcher_replace_after_seconds, loss.dispatcher) == (60, 300, "Recover")
    assert loss.fenced_by is None
    stored = parse(shardingPolicy="DYNAMIC", nodeLoss={"replaceAfterSeconds": 0}).node_loss
    assert (stored.replace_after_seconds, stored.worker_after) == (0, 30)


# --- The reconcile: what it reads and sends ---------------------------------------------------------


def reconcile_with(api: FakeApi, body: Manifest, pods: list[Manifest]) -> Outcome:
    for p in pods:
        p["metadata"]["ownerReferences"] = []
    observed = Observed(api.observed().objects, pods)
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed)


def started(api: FakeApi, body: Manifest) -> None:
    reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, api.observed())
    api.take_calls()


def with_node(api: FakeApi, seconds_ago: float, taint: str = nodeloss.UNREACHABLE_TAINT) -> None:
    taint_at = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    lost = node(taint=taint)
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
    # Read again within RECHECK_SECONDS: an out-of-service taint is acted on at once.
    assert outcome.requeue_after == nodeloss.RECHECK_SECONDS

    with_node(api, 61)
    api.objects[("Pod", "demo-worker-1")] = lost
    reconcile_with(api, body, [*ready, lost])
    assert [c for c in api.take_calls() if c[0] != "status"] == [
        ("get", "Node/node-a"),
        ("force-delete", "Pod/demo-worker-1"),
        ("event", "ReplacedLostPod"),
    ]


def with_local_journal(api: FakeApi) -> Manifest:
    """A dispatcher pod on node-a whose journal claim is bound to a local-path volume there."""
    claim = "journal-demo-dispatcher-0"
    api.objects[("PersistentVolumeClaim", claim)] = {"metadata": {"name": claim}, "spec": {"volumeName": "pv-1"}}
    api.objects[("PersistentVolume", "pv-1")] = copy.deepcopy(LOCAL_PATH_PV)
    api.objects[("Pod", "demo-dispatcher-0")] = dispatcher = pod("demo-dispatcher-0")
    return dispatcher


def test_a_local_journal_is_set_to_retain_before_its_claim_goes_and_with_wait_nothing_is_deleted() -> None:
    api, body = FakeApi(), service()
    started(api, body)
    claim, dispatcher = "journal-demo-dispatcher-0", with_local_journal(api)
    with_node(api, 120)  # a guess, and not yet 300 s: nothing but the Node is read
    reconcile_with(api, body, [dispatcher])
    assert [c for c in api.take_calls() if c[0] != "status"] == [("get", "Node/node-a")]
    with_node(api, 301)
    reconcile_with(api, body, [dispatcher])
    calls = [c for c in api.take_calls() if c[0] != "status"]
    assert calls == [
        ("get", "Node/node-a"),
        ("get", f"PersistentVolumeClaim/{claim}"),
        ("get", "PersistentVolume/pv-1"),
        ("retain", "PersistentVolume/pv-1"),
        ("delete", f"PersistentVolumeClaim/{claim}"),
        ("force-delete", "Pod/demo-dispatcher-0"),
        ("event", "JournalLost"),
    ]
    assert api.objects[("PersistentVolume", "pv-1")]["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert api.events[-1][0] == "Warning" and "the volume pv-1 (on node node-a) was first set to" in api.events[-1][2]
    ready = next(c for c in api.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]
    assert ready["reason"] == "JournalLost" and "the old journal is kept there" in ready["message"]

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


def test_a_journal_let_go_is_said_when_kubernetes_deleted_the_pod_first() -> None:
    # Out of service: the pod garbage collector force-deletes the node's pods too, and may come first.
    # The volume and the claim still changed now: the Warning says so, without claiming the deletion.
    api, body = FakeApi(), service()
    started(api, body)
    claim, dispatcher = "journal-demo-dispatcher-0", with_local_journal(api)
    del api.objects[("Pod", "demo-dispatcher-0")]
    with_node(api, 5, taint=nodeloss.OUT_OF_SERVICE_TAINT)
    reconcile_with(api, body, [dispatcher])
    calls = [c for c in api.take_calls() if c[0] in ("retain", "delete", "force-delete", "event")]
    assert calls == [
        ("retain", "PersistentVolume/pv-1"),
        ("delete", f"PersistentVolumeClaim/{claim}"),
        ("force-delete", "Pod/demo-dispatcher-0"),
        ("event", "JournalLost"),
    ]
    kind, _, message = api.events[-1]
    assert kind == "Warning" and message.startswith("The dispatcher pod demo-dispatcher-0 was already deleted"), message
    assert "the volume pv-1 (on node node-a) was first set to persistentVolumeReclaimPolicy Retain" in message
    # Nothing changed now (the claim gone, the volume kept already): nothing is said again.
    api.objects[("PersistentVolume", "pv-1")]["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    reconcile_with(api, body, [dispatcher])
    assert not [c for c in api.take_calls() if c[0] == "event"]


def test_a_claim_is_never_deleted_when_its_volume_could_not_be_set_to_retain() -> None:
    class Refusing(FakeApi):
        def retain(self, volume: str) -> Manifest:
            self.calls.append(("retain", f"PersistentVolume/{volume}"))
            raise ApiException(status=403, reason="Forbidden")

    api, body = Refusing(), service()
    started(api, body)
    claim, dispatcher = "journal-demo-dispatcher-0", with_local_journal(api)
    with_node(api, 5, taint=nodeloss.OUT_OF_SERVICE_TAINT)
    with pytest.raises(ApiException):
        reconcile_with(api, body, [dispatcher])
    assert [c for c in api.take_calls() if c[0] in ("retain", "delete", "force-delete")] == [
        ("retain", "PersistentVolume/pv-1")
    ]
    assert ("PersistentVolumeClaim", claim) in api.objects


def test_out_of_service_replaces_at_once_and_a_snapshot_being_written_holds_a_guessed_worker() -> None:
    """An unreachable node's worker is due, but a snapshot is being written: it stays (a second writer of
    its stream otherwise); once the node is tainted out-of-service, it goes at once."""
    api, body = FakeApi(), service(snapshots={"directory": "gs://b/snaps"})
    started(api, body)
    api.objects[("Node", "node-b")] = node("node-b", ready="True", taint=None)
    reads = []

    def saves(url: str) -> SnapshotsReport:
        reads.append(url)
        return SnapshotsReport((SnapshotProgress("gs://b/snaps/a", "IN_PROGRESS", journaled=True),), "journal")

    readers = Readers(fetch_snapshots=saves, read_server_info=lambda url: None, clock=Clock())
    disp = pod("demo-dispatcher-0", on="node-b", ready=True)
    disp["status"].update(phase="Running", podIP="10.0.0.9")
    lost = pod("demo-worker-0")
    api.objects[("Pod", "demo-worker-0")] = lost
    with_node(api, 600)

    def run() -> Outcome:
        for p in (disp, lost):
            p["metadata"]["ownerReferences"] = []
        observed = Observed(api.observed().objects, [disp, lost])
        return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)

    def node_loss_calls() -> list[tuple[str, str]]:
        return [c for c in api.take_calls() if c[0] == "force-delete" or c in (("event", "KeptForSnapshot"),)]

    run()
    assert node_loss_calls() == [("event", "KeptForSnapshot")]
    assert reads, "the snapshots were read for the worker due on a guess"
    workers = next(c for c in api.status["conditions"] if c["type"] == "WorkersReady")  # type: ignore[index]
    assert workers["reason"] == "KeptForSnapshot" and "snapshot gs://b/snaps/a is being written" in workers["message"]
    assert api.events[-1][0] == "Warning" and "snapshot gs://b/snaps/a is being written" in api.events[-1][2]
    readers.clock.now += NODE_READ_SECONDS  # type: ignore[attr-defined]
    run()
    assert not node_loss_calls(), "kept, and warned only once"

    with_node(api, 1, taint=nodeloss.OUT_OF_SERVICE_TAINT)
    readers.clock.now += NODE_READ_SECONDS  # type: ignore[attr-defined]
    run()
    assert [c for c in api.take_calls() if c[0] in ("force-delete", "event")] == [
        ("force-delete", "Pod/demo-worker-0"),
        ("event", "ReplacedLostPod"),
    ]
    assert "is known to be off: it is tainted node.kubernetes.io/out-of-service" in api.events[-1][2]


def test_the_pods_of_one_lost_node_cost_one_read_of_it_per_five_seconds() -> None:
    """Every event of a lost node's pods queues a reconcile: the Node is read once for all of them,
    and again only after NODE_READ_SECONDS (the pods' own watch brings the next change)."""
    api, body = FakeApi(), service()
    started(api, body)
    with_node(api, 20)
    clock = Clock()
    readers = Readers(clock=clock)
    lost = [pod("demo-worker-0"), pod("demo-worker-1"), pod("demo-dispatcher-0")]
    observed = Observed(api.observed().objects, lost)

    def reads() -> int:
        return sum(1 for call in api.take_calls() if call == ("get", "Node/node-a"))

    for _ in range(3):
        reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)
    assert reads() == 1
    clock.now += NODE_READ_SECONDS
    reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)
    assert reads() == 1


def test_a_dispatcher_waiting_for_the_node_of_its_journal_is_let_go_once_that_node_is_deleted() -> None:
    """The pod garbage collector deleted the dispatcher pod of a deleted node; its StatefulSet's new pod
    waits for the journal's volume, pinned to that node, for good: the volume is set to Retain, the
    claim let go, and the pod recreated. While the node exists and is not known to be off, it waits."""
    api, body = FakeApi(), service()
    started(api, body)
    claim, dispatcher = "journal-demo-dispatcher-0", with_local_journal(api)
    dispatcher["spec"] = {}
    dispatcher["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 node(s) didn't match PersistentVolume's node affinity.",
            "lastTransitionTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ]
    reconcile_with(api, body, [dispatcher])  # just unscheduled: nothing is read
    assert [c for c in api.take_calls() if c[0] != "status"] == []

    dispatcher["status"]["conditions"][0]["lastTransitionTime"] = (
        datetime.now(timezone.utc) - timedelta(seconds=nodeloss.RECHECK_SECONDS + 1)
    ).strftime("%Y-%m-%dT%H:%M:%SZ")
    api.objects[("Node", "node-a")] = node(ready="Unknown", tainted_ago=3600)  # only unreachable: it waits
    reconcile_with(api, body, [dispatcher])
    assert [c for c in api.take_calls() if c[0] != "status"] == [
        ("get", f"PersistentVolumeClaim/{claim}"),
        ("get", "PersistentVolume/pv-1"),
        ("get", "Node/node-a"),
    ]
    del api.objects[("Node", "node-a")]
    waiting = dict(dispatcher["status"]["conditions"][0])
    for message in ("0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
                    "no nodes available to schedule pods"):  # fmt: skip
        dispatcher["status"]["conditions"][0] = {**waiting, "message": message}
        reconcile_with(api, body, [dispatcher])  # a claim not bound yet, or no node at all: nothing is read
        assert [c for c in api.take_calls() if c[0] != "status"] == [], message
    dispatcher["status"]["conditions"][0] = waiting
    reconcile_with(api, body, [dispatcher])
    assert [c for c in api.take_calls() if c[0] in ("retain", "delete", "force-delete", "event")] == [
        ("retain", "PersistentVolume/pv-1"),
        ("delete", f"PersistentVolumeClaim/{claim}"),
        ("force-delete", "Pod/demo-dispatcher-0"),
        ("event", "JournalLost"),
    ]
    assert "its Node object was deleted" in api.events[-1][2] and "volume pv-1" in api.events[-1][2]
    assert nodeloss.pinned_node(LOCAL_PATH_PV) == "node-a"
    assert nodeloss.pinned_node(ZONAL_PV) is None
