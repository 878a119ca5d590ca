"""A node that stops answering, on a kind cluster of 3 nodes (KIND_NODES=3), with the defaults of
`spec.nodeLoss` (a worker replaced 60 s after its node is tainted unreachable; the dispatcher after
300 s, and then only where a returning node cannot harm its journal; at once when the node is known
to be off).

`kind/cluster.sh freeze` pauses a worker node's container: its kubelet, containerd and pods stop at
once and its address goes silent, as in a kernel hang, a partition, or a node that is only slow.
Kubernetes marks the node unreachable (its lifecycle controller, after the node's grace period) and
would evict its pods after 300 s, but a StatefulSet pod there would stay Terminating for as long as
the node is away. Each test thaws its node at the end: the kubelet finds its deleted pods and stops
them (docs/operations.md: the split-brain argument).

- a lost worker node: the workers there are replaced without a person (a guess, but a worker keeps
  no state);
- a slow node (frozen 90 s, then thawed) with the dispatcher and its local-path journal: nothing is
  replaced, the same journal stays, and a reader's job goes on;
- a node tainted node.kubernetes.io/out-of-service once it is frozen (what a person or a fencing
  agent does once the node is known to be off): the dispatcher is replaced within seconds, its old
  journal's volume kept (reclaim Retain), and the reader's job on the old journal fails;
- a worker node frozen while a snapshot is written, past replaceAfterSeconds: the worker is kept
  (KeptForSnapshot), not replaced by a second writer of its stream; thawed, the snapshot completes
  with every element once.

The services pin their pods with nodeSelectors: the control plane (the API server and the
operator run there) is never frozen, and the pod that loses its node has another node to go to.
The tier's pod-health check watches this module's namespace too: the pods on a node when it is
frozen (their logs cannot be read, and they may restart once it is back) are declared by uid, so
their replacements, under the same names on the nodes that stayed up, are checked as any pod.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kindpods import (
    elements,
    listing,
    logs,
    pod_nodes,
    shared_claim,
    snapshot_status,
    snapshot_trainer,
    start_reader,
    tfdata_service,
    wait_finished,
    wait_ready,
    wait_schedulable,
    whole_off,
)
from podhealth import PodHealth

from fixtures.cluster import create_namespace, delete_namespace
from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, holds_for, wait_for

ROOT = Path(__file__).resolve().parents[2]
POOL = "tfdata.dev/test-node-loss"  # the label of the two nodes the frozen pods run on


@pytest.fixture(scope="module")
def lab(kubectl: Kubectl) -> Iterator[tuple[str, list[str]]]:
    """The control plane and the two worker nodes, labelled POOL (the label is removed afterwards)."""
    names = wait_schedulable(kubectl, 3)
    plane = [n for n in names if n.endswith("-control-plane")]
    pool = [n for n in names if not n.endswith("-control-plane")]
    if len(plane) != 1 or len(pool) < 2:
        pytest.fail(f"these tests need a kind control plane and 2 worker nodes (KIND_NODES=3); schedulable: {names}")
    for node in pool[:2]:
        kubectl.run("label", "node", node, f"{POOL}=yes", "--overwrite")
    yield plane[0], pool[:2]
    for node in pool[:2]:
        kubectl.run("label", "node", node, f"{POOL}-", check=False)


@pytest.fixture(scope="module")
def node_loss_namespace(request: pytest.FixtureRequest, kubectl: Kubectl, pod_health: PodHealth) -> Iterator[str]:
    name = create_namespace(request, kubectl, "k", 60)
    pod_health.add_namespace(name)
    yield name
    kubectl.run(
        "delete", "tfdataservices", "--all", "-n", name, "--wait=true", "--timeout=180s", check=False, timeout=190
    )
    delete_namespace(kubectl, name)  # fails naming what holds it, if it is stuck


def kind_cluster(kubectl: Kubectl) -> dict[str, str]:
    context = kubectl.run("config", "current-context").stdout.strip()
    if not context.startswith("kind-"):
        pytest.fail(f"the kubeconfig's context is {context!r}, not a kind cluster's (kind-<name>)")
    return {**os.environ, "TFDATA_KIND_CLUSTER": context.removeprefix("kind-")}


def node_action(kubectl: Kubectl, action: str, node: str) -> None:
    done = subprocess.run(
        ["kind/cluster.sh", action, node], cwd=ROOT, env=kind_cluster(kubectl), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kind/cluster.sh {action} {node}: {done.stderr[-3000:]}"


def freeze(kubectl: Kubectl, pod_health: PodHealth, namespace: str, node: str, thaw: list[str]) -> None:
    """Freezes ``node`` (thawed by the ``thaw`` fixture if the test does not) and declares to the
    pod-health check the pods of ``namespace`` bound to it, listed once it is frozen (the tests
    start no pod of theirs between the freeze and the node's unreachable taint)."""
    thaw.append(node)
    node_action(kubectl, "freeze", node)
    on_node = kubectl.json("get", "pods", "-n", namespace, "--field-selector", f"spec.nodeName={node}")["items"]
    pods = {p["metadata"]["uid"]: p["metadata"]["name"] for p in on_node}
    pod_health.expect_frozen(namespace, pods, f"test_node_loss.py froze their node {node}")


@pytest.fixture
def thaw(kubectl: Kubectl) -> Iterator[list[str]]:
    """Nodes a test froze: thawed afterwards, and waited for until Ready."""
    frozen: list[str] = []
    yield frozen
    for node in frozen:
        node_action(kubectl, "thaw", node)
    for node in frozen:
        kubectl.run("wait", "--for=condition=Ready", f"node/{node}", "--timeout=180s", check=False, timeout=200)
    if frozen:
        wait_schedulable(kubectl, 3)


def service(
    name: str, namespace: str, count: int, policy: str, workers_on: dict[str, str], dispatcher_on: dict[str, str]
) -> dict[str, Any]:
    body = tfdata_service(name)
    body["metadata"]["namespace"] = namespace
    body["spec"]["shardingPolicy"] = policy
    body["spec"]["workers"]["replicas"] = count
    body["spec"]["workers"]["nodeSelector"] = workers_on
    body["spec"]["dispatcher"]["nodeSelector"] = dispatcher_on
    return body


def unreachable_since(kubectl: Kubectl, node: str) -> str | None:
    taints = kubectl.json("get", "node", node)["spec"].get("taints", [])
    return next((t.get("timeAdded") for t in taints if t["key"] == "node.kubernetes.io/unreachable"), None)


def events(kubectl: Kubectl, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """The TFDataService's Events, as (type, reason, message): structured, not `kubectl get`'s text."""
    selector = f"involvedObject.kind=TFDataService,involvedObject.name={name}"
    listed = kubectl.json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return [(e["type"], e["reason"], e["message"]) for e in listed]


def reasons_of(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    return [reason for _, reason, _ in events(kubectl, namespace, name)]


def test_a_lost_worker_node_is_replaced_without_a_human(
    kubectl: Kubectl, lab: tuple[str, list[str]], node_loss_namespace: str, pod_health: PodHealth, thaw: list[str]
) -> None:
    """Two services with workers on the two pool nodes and dispatchers on the control plane, a DYNAMIC
    one and a DATA one: both back at full count off the frozen node without a person.

    A DYNAMIC reader that was reading when the node froze waits on its request to the frozen worker:
    TensorFlow's client sets no gRPC keepalive and no deadline on it, and a silent peer never closes
    the connection. It reads on when the node comes back (the kubelet stops the deleted pod, which
    closes the connection), at most once; then a new job on each service reads exactly once. The
    figures say how long the reader waited (docs/operations.md#node-failure)."""
    plane, pool = lab
    ns, count = node_loss_namespace, 400
    on_plane, on_pool = {"kubernetes.io/hostname": plane}, {POOL: "yes"}
    kubectl.apply(service("lostdyn", ns, 2, "DYNAMIC", on_pool, on_plane))
    kubectl.apply(service("loststatic", ns, 2, "DATA", on_pool, on_plane))
    for name in ("lostdyn", "loststatic"):
        wait_ready(kubectl, ns, name)
    placed = pod_nodes(kubectl, ns, "lostdyn")
    node = placed["lostdyn-worker-0"]
    assert {placed["lostdyn-worker-0"], placed["lostdyn-worker-1"]} == set(pool), placed
    static_placed = pod_nodes(kubectl, ns, "loststatic")
    assert node in static_placed.values(), f"no worker of loststatic on {node}: {static_placed}"

    start_reader(kubectl, ns, "reader", "lostdyn", count, 0.2, plane, at_least=30)
    freeze(kubectl, pod_health, ns, node, thaw)
    stopped = time.monotonic()
    wait_for(lambda: unreachable_since(kubectl, node), 180, f"{node} marked unreachable", interval=1)
    unreachable_after = time.monotonic() - stopped
    for name in ("lostdyn", "loststatic"):
        wait_for(lambda n=name: whole_off(kubectl, ns, n, 2, node), 300, f"{name} Ready with 2 workers off {node}",
                 interval=1, show=lambda: listing(kubectl, ns))  # fmt: skip
    back = time.monotonic() - stopped
    replaced = events(kubectl, ns, "lostdyn")
    assert [m for t, r, m in replaced if (t, r) == ("Normal", "ReplacedLostPod") and "a worker keeps no state" in m], (
        replaced
    )

    read_while_away = len(elements(logs(kubectl, ns, "reader")))

    # The node comes back: its kubelet finds the pods deleted and stops them, which closes the
    # reader's connection to the old worker; the reader reads on, and new jobs read exactly once.
    node_action(kubectl, "thaw", node)
    thaw.remove(node)
    thawed = time.monotonic()
    kubectl.run("wait", "--for=condition=Ready", f"node/{node}", "--timeout=180s", timeout=200)
    wait_schedulable(kubectl, 3)
    phase, log = wait_finished(kubectl, ns, "reader", 300)
    reader_done = time.monotonic() - thawed
    got = elements(log)
    assert phase == "Succeeded" and log.rstrip().endswith("done"), log[-3000:]
    assert len(got) == len(set(got)) and set(got) <= set(range(count)), f"repeated: {len(got) - len(set(got))}"
    for name, policy_count in (("lostdyn", 200), ("loststatic", 80)):
        wait_for(lambda n=name: whole_off(kubectl, ns, n, 2, "no node"), 120, f"{name} whole after the thaw",
                 interval=1, show=lambda: listing(kubectl, ns))  # fmt: skip
        start_reader(kubectl, ns, f"{name}-after", name, policy_count, 0, plane)
        phase, after = wait_finished(kubectl, ns, f"{name}-after", 240)
        assert phase == "Succeeded" and sorted(elements(after)) == list(range(policy_count)), after[-2000:]
    figures = {
        "node": node, "unreachable_taint_after_s": round(unreachable_after, 1),
        "ready_at_full_count_after_s": round(back, 1), "reader_read_while_node_away": read_while_away,
        "reader_done_after_thaw_s": round(reader_done, 1), "reader_read": len(got),
        "reader_lost": count - len(got), "reader_repeated": len(got) - len(set(got)),
    }  # fmt: skip
    print(f"\nworker node lost: {json.dumps(figures)}")


def dispatcher_on_the_pool(
    kubectl: Kubectl, lab: tuple[str, list[str]], ns: str, name: str, **dispatcher: Any
) -> tuple[str, dict[str, Any]]:
    """A DYNAMIC service whose dispatcher (and its local-path journal) is on a pool node and whose worker
    is on the control plane, Ready: that node, and the journal's claim."""
    plane = lab[0]
    body = service(name, ns, 1, "DYNAMIC", {"kubernetes.io/hostname": plane}, {POOL: "yes"})
    body["spec"]["dispatcher"].update(dispatcher)
    kubectl.apply(body)
    wait_ready(kubectl, ns, name)
    node = pod_nodes(kubectl, ns, name)[f"{name}-dispatcher-0"]
    return node, kubectl.json("get", "pvc", f"journal-{name}-dispatcher-0", "-n", ns)


def test_a_slow_node_loses_nothing(
    kubectl: Kubectl, lab: tuple[str, list[str]], node_loss_namespace: str, pod_health: PodHealth, thaw: list[str]
) -> None:
    """The dispatcher's node frozen for 90 s, then thawed: it is tainted unreachable meanwhile, but that
    is a guess, and dispatcherReplaceAfterSeconds (300) has not passed; the same pod, on the same
    journal, serves on, and a reader that was reading when the node froze gets every element once.

    With TensorFlow's own client timeout (5 minutes): the operator's default, 10 s, has a dispatcher
    that did not hear from a client for 10 s drop it, and a frozen dispatcher hears from nobody (measured
    here: with the default the reader failed with "Iteration client id not found" right after the thaw)."""
    plane = lab[0]
    ns, name, count = node_loss_namespace, "slow", 300
    node, claim = dispatcher_on_the_pool(kubectl, lab, ns, name, clientTimeoutMs=300_000)
    pod_uid = kubectl.json("get", "pod", f"{name}-dispatcher-0", "-n", ns)["metadata"]["uid"]
    start_reader(kubectl, ns, "slow-reader", name, count, 0.1, plane, at_least=10)

    freeze(kubectl, pod_health, ns, node, thaw)
    frozen = time.monotonic()
    wait_for(lambda: unreachable_since(kubectl, node), 120, f"{node} marked unreachable", interval=1)
    tainted_after = time.monotonic() - frozen
    left = 90 - (time.monotonic() - frozen)
    holds_for(lambda: reasons_of(kubectl, ns, name), max(1.0, left), "no pod of the slow node replaced",
              lambda said: not {"ReplacedLostPod", "JournalLost"} & set(said))  # fmt: skip
    node_action(kubectl, "thaw", node)
    thaw.remove(node)
    away = time.monotonic() - frozen
    kubectl.run("wait", "--for=condition=Ready", f"node/{node}", "--timeout=180s", timeout=200)
    phase, log = wait_finished(kubectl, ns, "slow-reader", 300)
    got = elements(log)
    assert phase == "Succeeded" and sorted(got) == list(range(count)), log[-3000:]
    after = kubectl.json("get", "pvc", f"journal-{name}-dispatcher-0", "-n", ns)
    assert after["metadata"]["uid"] == claim["metadata"]["uid"], "the journal's claim was replaced"
    assert kubectl.json("get", "pod", f"{name}-dispatcher-0", "-n", ns)["metadata"]["uid"] == pod_uid
    said = events(kubectl, ns, name)
    assert not {"ReplacedLostPod", "JournalLost"} & {r for _, r, _ in said}, said
    wait_ready(kubectl, ns, name)
    figures = {"node": node, "unreachable_taint_after_s": round(tainted_after, 1), "frozen_s": round(away, 1),
               "replaced": 0, "reader_read": len(got), "reader_repeated": len(got) - len(set(got))}  # fmt: skip
    print(f"\nslow node: {json.dumps(figures)}")


def test_a_node_known_to_be_off_has_its_dispatcher_replaced_within_seconds_and_its_journal_kept(
    kubectl: Kubectl, lab: tuple[str, list[str]], node_loss_namespace: str, pod_health: PodHealth, thaw: list[str]
) -> None:
    """The dispatcher's node frozen, tainted unreachable: nothing happens to the dispatcher (a guess).
    Then it is tainted node.kubernetes.io/out-of-service (certain): the dispatcher comes back on the
    other pool node within seconds, on a fresh journal; the old journal's volume is set to Retain first
    (local-path's is Delete: its provisioner would delete the data when the node comes back), and it is
    still there after the thaw; the JournalLost Warning names it; the reader's job, on the old journal,
    ends with an error; a new job reads exactly once."""
    plane = lab[0]
    ns, name = node_loss_namespace, "fenced"
    node, claim = dispatcher_on_the_pool(kubectl, lab, ns, name)
    volume = claim["spec"]["volumeName"]
    start_reader(kubectl, ns, "fenced-reader", name, 100000, 0.1, plane, at_least=10)

    freeze(kubectl, pod_health, ns, node, thaw)
    wait_for(lambda: unreachable_since(kubectl, node), 180, f"{node} marked unreachable", interval=1)
    holds_for(lambda: reasons_of(kubectl, ns, name), 15, "the dispatcher kept on a guess",
              lambda said: not {"ReplacedLostPod", "JournalLost"} & set(said))  # fmt: skip
    kubectl.run("taint", "node", node, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
    marked = time.monotonic()
    try:
        wait_for(lambda: whole_off(kubectl, ns, name, 1, node), 180, f"{name} Ready off {node}", interval=0.5,
                 show=lambda: (listing(kubectl, ns), events(kubectl, ns, name)))  # fmt: skip
        replaced_after = time.monotonic() - marked
        new_claim = kubectl.json("get", "pvc", f"journal-{name}-dispatcher-0", "-n", ns)
        assert new_claim["metadata"]["uid"] != claim["metadata"]["uid"], "the dispatcher's claim was not replaced"
        pv = kubectl.json("get", "pv", volume)
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain", pv["spec"]
        said = events(kubectl, ns, name)
        lost = [m for t, r, m in said if (t, r) == ("Warning", "JournalLost")]
        assert len(lost) == 1 and f"the volume {volume} (" in lost[0] and "is known to be off" in lost[0], said
        start_reader(kubectl, ns, "fenced-after", name, 80, 0, plane)
        phase, log = wait_finished(kubectl, ns, "fenced-after", 240)
        assert phase == "Succeeded" and sorted(elements(log)) == list(range(80)), log[-2000:]
    finally:
        kubectl.run("taint", "node", node, "node.kubernetes.io/out-of-service-", check=False)
    # The node comes back: its kubelet stops the deleted dispatcher, which closes the reader's
    # connection to it; the reader's job was on the old journal, which the new dispatcher never read.
    node_action(kubectl, "thaw", node)
    thaw.remove(node)
    kubectl.run("wait", "--for=condition=Ready", f"node/{node}", "--timeout=180s", timeout=200)
    wait_schedulable(kubectl, 3)
    phase, log = wait_finished(kubectl, ns, "fenced-reader", 240)
    assert phase == "Failed", f"the reader's job was on the old journal, yet it ended {phase}:\n{log[-2000:]}"
    kept = holds_for(lambda: kubectl.run("get", "pv", volume, "-o", "name", "--ignore-not-found").stdout, 20,
                     f"the old journal's volume {volume} after the node came back",
                     lambda out: bool(out.strip()))  # fmt: skip
    assert kept > 1
    kubectl.run("delete", "pv", volume, "--wait=false")
    reader_error = log.strip().splitlines()[-1][-300:] if log.strip() else ""
    figures = {"node": node, "out_of_service_to_ready_elsewhere_s": round(replaced_after, 1), "volume_kept": volume,
               "reader_error": reader_error}  # fmt: skip
    print(f"\nnode known to be off: {json.dumps(figures)}")


def workers_condition(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    svc = kubectl.json("get", f"tfdata/{name}", "-n", namespace)
    return next((c for c in svc.get("status", {}).get("conditions", []) if c["type"] == "WorkersReady"), {})


def test_a_worker_node_frozen_while_a_snapshot_is_written_gets_no_second_writer(
    kubectl: Kubectl, lab: tuple[str, list[str]], node_loss_namespace: str, pod_health: PodHealth, thaw: list[str]
) -> None:
    """A service with spec.snapshots and replaceAfterSeconds at its least (30 s), its workers on the two
    pool nodes, writes a snapshot; one worker's node is frozen with its stream unfinished. Past the
    unreachable taint plus 30 s the worker is still the same pod (no second writer of its stream, at
    the same address), sampled until 20 s past that; WorkersReady says KeptForSnapshot and a Warning
    Event of that reason is sent once. Thawed, the same worker finishes its stream: the snapshot
    completes with both streams and every element once.

    TensorFlow's own worker timeout is set to 10 minutes: with its default the dispatcher hands a
    silent worker's stream to the other worker after a while, and the snapshot could end during the
    freeze; the operator's decision, not TensorFlow's, is under test here."""
    began = time.monotonic()
    plane = lab[0]
    ns, name, count = node_loss_namespace, "frozensnap", 600
    volume = shared_claim(kubectl, ns, f"shared-{ns}")
    try:
        body = service(name, ns, 2, "DYNAMIC", {POOL: "yes"}, {"kubernetes.io/hostname": plane})
        body["spec"]["snapshots"] = {"directory": "/snapshots", "volume": {"claimName": "shared"}}
        body["spec"]["nodeLoss"] = {"replaceAfterSeconds": 30}
        body["spec"]["dispatcher"]["workerTimeoutMs"] = 600_000
        kubectl.apply(body)
        wait_ready(kubectl, ns, name)
        placed = pod_nodes(kubectl, ns, name)
        node = placed[f"{name}-worker-1"]
        assert placed[f"{name}-worker-0"] != node, placed
        worker = kubectl.json("get", "pod", f"{name}-worker-1", "-n", ns)["metadata"]["uid"]

        snapshot = f"{ns}-frozen"  # the shared directory is every namespace's: a name of its own
        kubectl.apply({"apiVersion": API_VERSION, "kind": "TFDataSnapshot",
                       "metadata": {"name": "frozen", "namespace": ns},
                       "spec": {"service": name, "snapshotName": snapshot, "deletionPolicy": "Delete"}})  # fmt: skip
        saved = snapshot_trainer(kubectl, ns, "save", name, "save", snapshot, name, f"--elements={count}",
                                 "--sleep-us=100000", node=plane)  # fmt: skip
        assert f"saved /snapshots/{snapshot}" in saved, saved
        # Both workers took a stream and neither finished: 600 elements at 0.1 s take 30 s over two.
        writing = ("IN_PROGRESS", 2, 0)
        wait_for(lambda: snapshot_status(kubectl, ns, "frozen"), 60, "two streams started, none finished",
                 until=lambda s: (s.get("state"), s.get("streamsTotal"), s.get("streamsDone", 0)) == writing,
                 interval=0.5)  # fmt: skip

        freeze(kubectl, pod_health, ns, node, thaw)
        frozen = time.monotonic()
        since = wait_for(lambda: unreachable_since(kubectl, node), 120, f"{node} marked unreachable", interval=1)
        tainted_after = time.monotonic() - frozen

        def seen() -> tuple[Any, ...]:
            pods = pod_nodes(kubectl, ns, name)
            uid = kubectl.json("get", "pod", f"{name}-worker-1", "-n", ns)["metadata"]["uid"]
            said = events(kubectl, ns, name)
            return (uid, sorted(pods), snapshot_status(kubectl, ns, "frozen").get("state"),
                    workers_condition(kubectl, ns, name).get("reason"), [(t, r) for t, r, _ in said])  # fmt: skip

        def kept(now: tuple[Any, ...]) -> bool:
            uid, pods, state, _, said = now
            workers = [p for p in pods if "-worker-" in p]
            return (uid == worker and workers == [f"{name}-worker-0", f"{name}-worker-1"] and state == "IN_PROGRESS"
                    and not any(r == "ReplacedLostPod" for _, r in said))  # fmt: skip

        # Due at the taint plus 30 s (the operator's clock: the taint's timeAdded); sampled until 20 s past it.
        due_in = 30 - (time.monotonic() - frozen - tainted_after)
        samples = holds_for(seen, max(1.0, due_in), "the worker kept before replaceAfterSeconds", kept, interval=1)
        warning = ("Warning", "KeptForSnapshot")
        said = wait_for(seen, 30, "WorkersReady KeptForSnapshot and its Warning", interval=1,
                        until=lambda now: now[3] == "KeptForSnapshot" and warning in now[4])  # fmt: skip
        assert kept(said), said
        samples += holds_for(seen, 20, "the worker kept while the snapshot is written",
                             lambda now: kept(now) and now[3] == "KeptForSnapshot", interval=1)  # fmt: skip
        warned = [m for t, r, m in events(kubectl, ns, name) if (t, r) == ("Warning", "KeptForSnapshot")]
        assert len(warned) == 1 and f"{name}-worker-1" in warned[0] and snapshot in warned[0], warned
        held = time.monotonic() - frozen

        node_action(kubectl, "thaw", node)
        thaw.remove(node)
        thawed = time.monotonic()
        kubectl.run("wait", "--for=condition=Ready", f"node/{node}", "--timeout=180s", timeout=200)
        done = wait_for(lambda: snapshot_status(kubectl, ns, "frozen"), 180, "the snapshot to end",
                        until=lambda s: s.get("state") in ("COMPLETED", "FAILED", "ABANDONED"), interval=1)  # fmt: skip
        completed_after = time.monotonic() - thawed
        assert (done["state"], done["elements"], done["streams"]) == ("COMPLETED", count, "2/2"), done
        assert kubectl.json("get", "pod", f"{name}-worker-1", "-n", ns)["metadata"]["uid"] == worker
        assert not [e for e in events(kubectl, ns, name) if e[1] == "ReplacedLostPod"]
        loaded = snapshot_trainer(kubectl, ns, "load", name, "load", snapshot, name, node=plane)
        got = sorted(line.split(" ", 1)[1] for line in loaded.splitlines() if line.startswith("element "))
        assert got == sorted(f"{i},{i * i + 7}" for i in range(count)), loaded[-2000:]
        kubectl.run("delete", "tfsnap", "frozen", "-n", ns, "--timeout=90s", timeout=100)
    finally:
        kubectl.run("delete", "pv", volume, "--wait=false", check=False)
    figures = {"node": node, "unreachable_taint_after_s": round(tainted_after, 1), "taint_time": since,
               "frozen_s": round(held, 1), "hold_samples": samples, "replaced": 0,
               "completed_after_thaw_s": round(completed_after, 1), "elements": done["elements"],
               "case_s": round(time.monotonic() - began, 1)}  # fmt: skip
    print(f"\nworker node frozen while a snapshot is written: {json.dumps(figures)}")
