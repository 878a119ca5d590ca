"""A service that cannot run says why in its conditions, with Kubernetes' own reason and message.

Each failure is provoked for real: the API server's Priority admission refuses the pods of a
missing PriorityClass (the StatefulSet controller's FailedCreate), the scheduler finds no node
for a nodeSelector, the volume controller cannot provision a claim of a StorageClass that does
not exist. The kubelet's two failures, ImagePullBackOff and CrashLoopBackOff (tests/fixtures/cases.py
KUBELET_FAILURES), need a kubelet: on this tier's node-less cluster kwok (the simulated kubelet of
its one node) writes them, following the project's Stages `pod-image-pull-backoff` and
`pod-crash-loop-backoff` in devcluster/kwok/stages.yaml for pods carrying their label, with the text a
real kubelet writes; on kind (`make test-e2e-kind` runs this suite there too, and tests/kind runs
the same cases) the same specs fail for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fixtures.cases import KUBELET_FAILURES, KWOK, Unready, conditions, manifest, wait_explained
from fixtures.support import Kubectl, OperatorProcess, kubelet_nodes, wait_for

# The dispatcher of the cases about workers runs (on kwok's node), so that Ready names the workers' problem.
DISPATCHER_RUNS = f"dispatcher: {{tolerations: [{KWOK}]}}"
TIMEOUT = 60
# A real kubelet pulls, starts TensorFlow and backs off; kwok answers at once.
KIND_TIMEOUT = 180


CASES = [
    Unready(
        "no-priority",
        f"shardingPolicy: DYNAMIC\n{DISPATCHER_RUNS}\nworkers: {{replicas: 2, priorityClassName: does-not-exist}}",
        "WorkersReady",
        "FailedCreate",
        (
            "0/2 workers are ready and up to date: StatefulSet no-priority-worker cannot create pod "
            "no-priority-worker-",
            "no PriorityClass with name does-not-exist was found",
        ),
    ),
    Unready(
        "nowhere",
        f"shardingPolicy: DYNAMIC\n{DISPATCHER_RUNS}\n"
        f"workers: {{replicas: 1, nodeSelector: {{tfdata.dev/test: none}}, tolerations: [{KWOK}]}}",
        "WorkersReady",
        "Unschedulable",
        (
            "Pod nowhere-worker-0 cannot be scheduled: 0/1 nodes are available:",
            "didn't match Pod's node affinity/selector",
        ),
    ),
    # Its worker is left unscheduled, as crashing's (tests/fixtures/cases.py): it would only wait for that dispatcher,
    # and on kind two default workers (250m of CPU each) running beside the other cases' dispatchers fill the
    # node, and leave a dispatcher there unschedulable.
    Unready(
        "no-class",
        "shardingPolicy: DYNAMIC\ndispatcher:\n  faultTolerantMode: true\n"
        f"  storage: {{storageClassName: does-not-exist}}\n  tolerations: [{KWOK}]\n"
        "workers: {replicas: 1, nodeSelector: {tfdata.dev/test: none}}",
        "DispatcherReady",
        "ProvisioningFailed",
        (
            "The dispatcher is not ready: The claim journal-no-class-dispatcher-0 is not bound:",
            'storageclass.storage.k8s.io "does-not-exist" not found',
        ),
    ),
    *KUBELET_FAILURES,
]


@pytest.fixture(scope="module")
def has_kubelets(kubectl: Kubectl) -> bool:
    """Whether real kubelets run this cluster's pods (kind), not kwok."""
    return bool(kubelet_nodes(kubectl.json("get", "nodes")))


@pytest.fixture(scope="module")
def applied(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> Iterator[dict[str, Unready]]:
    """Every case applied at once: they are independent, and their waits overlap."""
    for case in CASES:
        kubectl.run("apply", "-n", namespace, "-f", "-", input=manifest(case))
    yield {c.name: c for c in CASES}


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_the_condition_says_why_with_the_childs_reason(
    kubectl: Kubectl, namespace: str, applied: dict[str, Unready], has_kubelets: bool, name: str
) -> None:
    wait_explained(kubectl, namespace, applied[name], KIND_TIMEOUT if has_kubelets else TIMEOUT)


def test_a_problem_fixed_is_no_longer_reported(
    kubectl: Kubectl, namespace: str, applied: dict[str, Unready], has_kubelets: bool
) -> None:
    """Once the PriorityClass exists, the StatefulSet creates its pods and the condition moves on."""

    def workers() -> dict[str, Any]:
        return conditions(kubectl, namespace, "no-priority").get("WorkersReady", {})

    wait_for(lambda: workers().get("reason"), TIMEOUT, "WorkersReady=FailedCreate on no-priority",
             until=lambda reason: reason == "FailedCreate")  # fmt: skip
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "does-not-exist"}, "value": 1000}  # fmt: skip
    kubectl.apply(priority)
    try:
        if has_kubelets:
            # A real node takes the pods, and the condition moves on to what they do there.
            selector = "app.kubernetes.io/instance=no-priority,app.kubernetes.io/component=worker"
            wait_for(lambda: len(kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]),
                     KIND_TIMEOUT, "the 2 worker pods of no-priority", until=lambda count: count == 2)  # fmt: skip
            wait_for(workers, TIMEOUT, "WorkersReady to stop saying FailedCreate",
                     until=lambda c: c.get("reason") not in (None, "FailedCreate"), show=workers)  # fmt: skip
            return
        # No kwok toleration: the created pods are now held by the node's taint, which the condition says instead.
        found = wait_for(workers, TIMEOUT, "WorkersReady to stop saying FailedCreate",
                         until=lambda c: c.get("reason") == "Unschedulable")  # fmt: skip
        assert "untolerated taint" in found["message"], found
    finally:
        kubectl.run("delete", "priorityclass", "does-not-exist", "--ignore-not-found")
