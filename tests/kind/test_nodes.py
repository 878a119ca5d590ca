"""A TFDataService on several kind nodes (kind/cluster.sh up with KIND_NODES=3): where its pods land,
a trainer on another node, the NetworkPolicy between nodes, and `kubectl drain`.

The cluster's pod network is flannel (host-gw) on a node image built here, or kindnetd on the
published one; NetworkPolicies are enforced on every node (kind/README.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kindpods import (
    connect_from_pod,
    elements,
    listing,
    pod_nodes,
    start_pod,
    start_reader,
    tfdata_service,
    wait_finished,
    wait_ready,
    wait_schedulable,
    whole_off,
)

from fixtures.support import Kubectl, wait_for

NAME = "spread"
STATIC = "spreadstatic"


@pytest.fixture(scope="module")
def nodes(kubectl: Kubectl) -> list[str]:
    return wait_schedulable(kubectl, 3)


@pytest.fixture(scope="module")
def spread(kubectl: Kubectl, namespace: str, nodes: list[str]) -> str:
    """A DYNAMIC service with two workers."""
    kubectl.apply({**tfdata_service(NAME), "metadata": {"name": NAME, "namespace": namespace}})
    wait_ready(kubectl, namespace, NAME)
    return namespace


def on_node(node: str) -> dict[str, Any]:
    return {"nodeSelector": {"kubernetes.io/hostname": node}}


def test_workers_land_on_different_nodes(kubectl: Kubectl, spread: str) -> None:
    placed = pod_nodes(kubectl, spread, NAME)
    workers = {placed[f"{NAME}-worker-{i}"] for i in range(2)}
    assert len(workers) == 2, (
        f"both workers on one node (the anti-affinity is preferred, and 3 nodes had room): {placed}"
    )


TRAINER = """
import json, sys
import tensorflow as tf
from tfdata_operator.client import distribute
dataset = tf.data.Dataset.range(int(sys.argv[2])).apply(distribute(sys.argv[1], job_name="elsewhere"))
print("elements", json.dumps([int(x) for x in dataset]), flush=True)
"""


def test_a_trainer_on_a_node_without_workers_reads_exactly_once(
    kubectl: Kubectl, spread: str, nodes: list[str]
) -> None:
    placed = pod_nodes(kubectl, spread, NAME)
    other = next(n for n in nodes if n not in {placed[f"{NAME}-worker-0"], placed[f"{NAME}-worker-1"]})
    env_from = [{"configMapRef": {"name": f"{NAME}-client"}}]
    labels = {"tfdata.dev/client": NAME}
    start_pod(kubectl, spread, "trainer", labels, TRAINER, NAME, "300", envFrom=env_from, pod_spec=on_node(other))
    ran_on = wait_for(
        lambda: kubectl.json("get", "pod", "trainer", "-n", spread)["spec"].get("nodeName"), 60, "trainer scheduled"
    )
    phase, log = wait_finished(kubectl, spread, "trainer", 240)
    assert ran_on == other
    lines = [line for line in log.splitlines() if line.startswith("elements ")]
    assert phase == "Succeeded" and lines, log[-3000:]
    got = json.loads(lines[-1].split(" ", 1)[1])
    assert sorted(got) == list(range(300)), f"{len(got)} elements, {len(set(got))} distinct"


def test_network_policy_is_enforced_between_nodes(kubectl: Kubectl, spread: str, nodes: list[str]) -> None:
    """A worker on one node, probes from another: the client label admits, its absence is refused."""
    worker = kubectl.json("get", "pod", f"{NAME}-worker-0", "-n", spread)
    port = kubectl.json("get", f"tfdata/{NAME}", "-n", spread)["spec"]["workers"].get("port", 5051)
    target = f"{worker['status']['podIP']}:{port}"
    other = next(n for n in nodes if n != worker["spec"]["nodeName"])
    admitted = connect_from_pod(kubectl, spread, "probe-labelled", {"tfdata.dev/client": NAME}, target, on_node(other))
    assert admitted.startswith("connected"), (
        f"a labelled pod on {other} could not reach the worker at {target}: {admitted}"
    )
    refused = connect_from_pod(kubectl, spread, "probe-unlabelled", {"app": "other"}, target, on_node(other))
    assert refused.startswith("timeout"), f"an unlabelled pod on {other} reached the worker at {target}: {refused}"


@pytest.fixture
def uncordon(kubectl: Kubectl) -> Iterator[list[str]]:
    drained: list[str] = []
    yield drained
    for node in drained:
        kubectl.run("uncordon", node, check=False)


def drain(kubectl: Kubectl, node: str, timeout: int) -> Any:
    return kubectl.run(
        "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout}s",
        check=False, timeout=timeout + 30,
    )  # fmt: skip


def worker_node_without_dispatcher(kubectl: Kubectl, namespace: str, name: str, workers: int) -> tuple[str, str]:
    """A worker, and its node, where the dispatcher does not run (its journal is on that node's disk)."""
    placed = pod_nodes(kubectl, namespace, name)
    dispatcher = placed[f"{name}-dispatcher-0"]
    for i in range(workers):
        if placed[f"{name}-worker-{i}"] != dispatcher:
            return f"{name}-worker-{i}", placed[f"{name}-worker-{i}"]
    pytest.fail(f"every worker runs on the dispatcher's node: {placed}")


def test_a_drain_moves_a_dynamic_worker_and_the_reader_reads_on(
    kubectl: Kubectl, spread: str, uncordon: list[str]
) -> None:
    """DYNAMIC: the budget lets the drain take the worker at once; the StatefulSet brings it back on
    another node; the reader goes on, losing at most the splits the evicted worker held."""
    ns, count = spread, 400
    _, node = worker_node_without_dispatcher(kubectl, ns, NAME, 2)
    reader_node = pod_nodes(kubectl, ns, NAME)[f"{NAME}-dispatcher-0"]
    start_reader(kubectl, ns, "reader", NAME, count, 0.1, reader_node, at_least=40)
    started = time.monotonic()
    uncordon.append(node)
    drained = drain(kubectl, node, 180)
    took = time.monotonic() - started
    assert drained.returncode == 0, (
        f"kubectl drain {node} failed after {took:.0f}s:\n{drained.stdout}\n{drained.stderr}"
    )
    wait_for(
        lambda: whole_off(kubectl, ns, NAME, 2, node),
        300,
        f"{NAME} whole off {node}",
        interval=1,
        show=lambda: listing(kubectl, ns),
    )
    back = time.monotonic() - started
    phase, log = wait_finished(kubectl, ns, "reader", 300)
    got = elements(log)
    assert phase == "Succeeded" and log.rstrip().endswith("done"), log[-2000:]
    assert len(got) == len(set(got)) and set(got) <= set(range(count)), f"repeated: {len(got) - len(set(got))}"
    print(
        f"\ndrain of {node}: {took:.1f}s; service Ready with 2 workers {back:.1f}s after the drain began; "
        f"the reader read {len(got)} of {count}, lost {count - len(got)}, none twice"
    )


@pytest.fixture(scope="module")
def static(kubectl: Kubectl, namespace: str, nodes: list[str]) -> str:
    """A DATA-sharded service with two workers (rescalePolicy: the default, WhenIdle)."""
    body = tfdata_service(STATIC)
    body["metadata"]["namespace"] = namespace
    body["spec"]["shardingPolicy"] = "DATA"
    kubectl.apply(body)
    wait_ready(kubectl, namespace, STATIC)
    return namespace


def test_a_drain_waits_for_a_static_reader_then_goes_ahead(kubectl: Kubectl, static: str, uncordon: list[str]) -> None:
    """Static sharding: a worker restarted elsewhere would read its shard again from the start, so
    the budget refuses the eviction while a client reads; the drain completes once it has ended, and
    a new job then reads every element exactly once."""
    ns, count = static, 150
    worker, node = worker_node_without_dispatcher(kubectl, ns, STATIC, 2)
    reader_node = pod_nodes(kubectl, ns, STATIC)[f"{STATIC}-dispatcher-0"]
    start_reader(kubectl, ns, "static-reader", STATIC, count, 0.3, reader_node, at_least=10)

    def budget() -> int:
        pdb = kubectl.json("get", "pdb", f"{STATIC}-worker", "-n", ns)
        return int(pdb["status"].get("disruptionsAllowed", -1)) if pdb["spec"].get("maxUnavailable") == 0 else -1

    wait_for(lambda: budget() == 0, 90, "the worker budget at 0 while a client reads", interval=1,
             show=lambda: kubectl.run("get", "pdb", "-n", ns, "-o", "yaml", check=False).stdout)  # fmt: skip
    uncordon.append(node)
    refused = drain(kubectl, node, 20)
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, (refused.stdout, refused.stderr)
    assert pod_nodes(kubectl, ns, STATIC)[worker] == node, f"{worker} was moved while the reader read"

    phase, log = wait_finished(kubectl, ns, "static-reader", 300)
    assert phase == "Succeeded" and sorted(elements(log)) == list(range(count)), log[-2000:]
    ended = time.monotonic()
    drained = drain(kubectl, node, 180)
    assert drained.returncode == 0, f"kubectl drain {node} failed after the reader ended:\n{drained.stderr}"
    print(f"\nstatic drain of {node} completed {time.monotonic() - ended:.1f}s after the reader ended")
    wait_for(
        lambda: whole_off(kubectl, ns, STATIC, 2, node),
        300,
        f"{STATIC} whole off {node}",
        interval=1,
        show=lambda: listing(kubectl, ns),
    )
    start_reader(kubectl, ns, "static-after", STATIC, 60, 0, reader_node)
    phase, log = wait_finished(kubectl, ns, "static-after", 240)
    assert phase == "Succeeded" and sorted(elements(log)) == list(range(60)), log[-2000:]
