"""A node that stops answering, on a kind cluster of 3 nodes (KIND_NODES=3), with the defaults
(`spec.nodeLoss`: replace after 60 s, dispatcher Recover).

`kind/cluster.sh freeze` pauses a worker node's container: its kubelet, containerd and pods stop at
once and its address goes silent, as in a kernel hang or a partition. Kubernetes marks the node
unreachable (its lifecycle controller, after the node's grace period) and would evict its pods
after 300 s, but a StatefulSet pod there would stay Terminating for as long as the node is away.
The operator replaces the service's pods there itself once the node has been unreachable for
`replaceAfterSeconds`. Each test thaws its node at the end: the kubelet finds its pods deleted and
stops them (docs/operations.md: the split-brain argument).

The services pin their pods with nodeSelectors: the control plane (the API server and the
operator run there) is never frozen, and the pod that loses its node has another node to go to.
This module's namespace is not watched by the tier's pod-health check: a frozen node's pods
cannot be read.
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
    start_reader,
    tfdata_service,
    wait_finished,
    wait_ready,
    wait_schedulable,
    whole_off,
)
from support import Kubectl, wait_for

from fixtures.cluster import create_namespace

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
def namespace_unwatched(request: pytest.FixtureRequest, kubectl: Kubectl) -> Iterator[str]:
    name = create_namespace(request, kubectl, "k", 60)
    yield name
    kubectl.run(
        "delete", "tfdataservices", "--all", "-n", name, "--wait=true", "--timeout=180s", check=False, timeout=190
    )
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")


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


def events(kubectl: Kubectl, namespace: str, name: str) -> str:
    return kubectl.run("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}").stdout


def test_a_lost_worker_node_is_replaced_without_a_human(
    kubectl: Kubectl, lab: tuple[str, list[str]], namespace_unwatched: str, thaw: list[str]
) -> None:
    """Two services with workers on the two pool nodes and dispatchers on the control plane, a DYNAMIC
    one and a DATA one: both back at full count off the frozen node without a person.

    A DYNAMIC reader that was reading when the node froze waits on its request to the frozen worker:
    TensorFlow's client sets no gRPC keepalive and no deadline on it, and a silent peer never closes
    the connection. It reads on when the node comes back (the kubelet stops the deleted pod, which
    closes the connection), at most once; then a new job on each service reads exactly once. The
    figures say how long the reader waited (docs/operations.md#node-failure)."""
    plane, pool = lab
    ns, count = namespace_unwatched, 400
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
    thaw.append(node)
    node_action(kubectl, "freeze", node)
    stopped = time.monotonic()
    wait_for(lambda: unreachable_since(kubectl, node), 180, f"{node} marked unreachable", interval=1)
    unreachable_after = time.monotonic() - stopped
    for name in ("lostdyn", "loststatic"):
        wait_for(lambda n=name: whole_off(kubectl, ns, n, 2, node), 300, f"{name} Ready with 2 workers off {node}",
                 interval=1, show=lambda: listing(kubectl, ns))  # fmt: skip
    back = time.monotonic() - stopped
    replaced = events(kubectl, ns, "lostdyn")
    assert "ReplacedLostPod" in replaced, replaced

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


def test_a_lost_dispatcher_node_comes_back_on_a_fresh_journal(
    kubectl: Kubectl, lab: tuple[str, list[str]], namespace_unwatched: str, thaw: list[str]
) -> None:
    """The dispatcher on a pool node with its journal on that node's disk (local-path): Recover
    replaces the claim and the pod; the new dispatcher starts on a fresh journal on the other pool
    node; the status and an Event say the running jobs were lost; a new job reads exactly once."""
    plane = lab[0]
    ns, name = namespace_unwatched, "lostdisp"
    kubectl.apply(service(name, ns, 1, "DYNAMIC", {"kubernetes.io/hostname": plane}, {POOL: "yes"}))
    wait_ready(kubectl, ns, name)
    node = pod_nodes(kubectl, ns, name)[f"{name}-dispatcher-0"]
    claim = f"journal-{name}-dispatcher-0"
    volume = kubectl.json("get", "pvc", claim, "-n", ns)["spec"]["volumeName"]
    start_reader(kubectl, ns, "disp-reader", name, 100000, 0.1, plane, at_least=10)

    thaw.append(node)
    node_action(kubectl, "freeze", node)
    stopped = time.monotonic()
    wait_for(lambda: unreachable_since(kubectl, node), 180, f"{node} marked unreachable", interval=1)
    unreachable_after = time.monotonic() - stopped
    wait_for(lambda: whole_off(kubectl, ns, name, 1, node), 400, f"{name} Ready off {node}", interval=1,
             show=lambda: listing(kubectl, ns))  # fmt: skip
    back = time.monotonic() - stopped
    new_volume = kubectl.json("get", "pvc", claim, "-n", ns)["spec"]["volumeName"]
    assert new_volume != volume, "the dispatcher's claim was not replaced"
    said = events(kubectl, ns, name)
    assert "lost" in said, said

    # The reader's job was on the old journal: it ends with an error. A new job reads exactly once.
    kubectl.run("delete", "pod", "disp-reader", "-n", ns, "--wait=false")
    start_reader(kubectl, ns, "disp-after", name, 80, 0, plane)
    phase, log = wait_finished(kubectl, ns, "disp-after", 240)
    assert phase == "Succeeded" and sorted(elements(log)) == list(range(80)), log[-2000:]
    figures = {"node": node, "unreachable_taint_after_s": round(unreachable_after, 1), "ready_after_s": round(back, 1)}
    print(f"\ndispatcher node lost: {json.dumps(figures)}")

    node_action(kubectl, "thaw", node)
    thaw.remove(node)
    kubectl.run("wait", "--for=condition=Ready", f"node/{node}", "--timeout=180s", timeout=200)
    wait_schedulable(kubectl, 3)
    wait_ready(kubectl, ns, name)
