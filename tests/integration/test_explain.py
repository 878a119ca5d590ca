"""A service that cannot run says why in its conditions, with Kubernetes' own reason and message.

Each failure is provoked for real: the API server's Priority admission refuses the pods of a
missing PriorityClass (the StatefulSet controller's FailedCreate), the scheduler finds no node
for a nodeSelector, the volume controller cannot provision a claim of a StorageClass that does
not exist. The cluster has no kubelet: the two kubelet states, ImagePullBackOff and
CrashLoopBackOff, are written by kwok (the simulated kubelet of the cluster's one node) following
the project's Stages `pod-image-pull-backoff` and `pod-crash-loop-backoff` in devcluster/kwok/stages.yaml,
for pods carrying their label. That the real kubelet writes the same reasons is what the kind
tier (real kubelets) would show; it is not run here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support import Kubectl, OperatorProcess, wait_for

import devcluster

KWOK = json.dumps(devcluster.KWOK_TOLERATION)
# The dispatcher of the cases about workers runs (on kwok's node), so that Ready names the workers' problem.
DISPATCHER_RUNS = f"dispatcher: {{tolerations: [{KWOK}]}}"
TIMEOUT = 60


def service(name: str, spec: str) -> str:
    body = "\n".join("  " + line for line in spec.strip().splitlines())
    return f"apiVersion: tfdata.dev/v1alpha1\nkind: TFDataService\nmetadata:\n  name: {name}\nspec:\n{body}\n"


class Case:
    def __init__(self, name: str, spec: str, condition: str, reason: str, *says: str) -> None:
        self.name, self.spec, self.condition, self.reason, self.says = name, spec, condition, reason, says


CASES = [
    Case(
        "no-priority",
        f"shardingPolicy: DYNAMIC\n{DISPATCHER_RUNS}\nworkers: {{replicas: 2, priorityClassName: does-not-exist}}",
        "WorkersReady",
        "FailedCreate",
        "0/2 workers are ready and up to date: StatefulSet no-priority-worker cannot create pod no-priority-worker-",
        "no PriorityClass with name does-not-exist was found",
    ),
    Case(
        "nowhere",
        f"shardingPolicy: DYNAMIC\n{DISPATCHER_RUNS}\n"
        f"workers: {{replicas: 1, nodeSelector: {{tfdata.dev/test: none}}, tolerations: [{KWOK}]}}",
        "WorkersReady",
        "Unschedulable",
        "Pod nowhere-worker-0 cannot be scheduled: 0/1 nodes are available:",
        "didn't match Pod's node affinity/selector",
    ),
    Case(
        "no-class",
        "shardingPolicy: DYNAMIC\ndispatcher:\n  faultTolerantMode: true\n"
        f"  storage: {{storageClassName: does-not-exist}}\n  tolerations: [{KWOK}]",
        "DispatcherReady",
        "ProvisioningFailed",
        "The dispatcher is not ready: The claim journal-no-class-dispatcher-0 is not bound:",
        'storageclass.storage.k8s.io "does-not-exist" not found',
    ),
    Case(
        "no-image",
        f"shardingPolicy: DYNAMIC\nimage: registry.invalid/tfdata-server:none\n{DISPATCHER_RUNS}\n"
        f"workers: {{replicas: 1, tolerations: [{KWOK}], labels: {{image-pull-backoff.stage.tfdata.dev: 'true'}}}}",
        "WorkersReady",
        "ImagePullBackOff",
        "Pod no-image-worker-0: container worker is in ImagePullBackOff:",
        'Back-off pulling image "registry.invalid/tfdata-server:none"',
    ),
    Case(
        "crashing",
        f"shardingPolicy: DYNAMIC\n{DISPATCHER_RUNS}\nworkers: {{replicas: 1, tolerations: [{KWOK}], "
        "labels: {crash-loop-backoff.stage.tfdata.dev: 'true'}}",
        "WorkersReady",
        "CrashLoopBackOff",
        "Pod crashing-worker-0: container worker is in CrashLoopBackOff: back-off 40s restarting failed container=",
        "it last exited with code 1 (Error)",
    ),
]


@pytest.fixture(scope="module")
def applied(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> Iterator[dict[str, Case]]:
    """Every case applied at once: they are independent, and their waits overlap."""
    for case in CASES:
        kubectl.run("apply", "-n", namespace, "-f", "-", input=service(case.name, case.spec))
    yield {c.name: c for c in CASES}


def condition(kubectl: Kubectl, namespace: str, name: str, kind: str) -> dict[str, Any]:
    obj = kubectl.get("tfdataservice", name, "-n", namespace) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_the_condition_says_why_with_the_childs_reason(
    kubectl: Kubectl, namespace: str, applied: dict[str, Case], name: str
) -> None:
    case = applied[name]

    def pods() -> Any:
        return [
            (p["metadata"]["name"], p.get("status"))
            for p in kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"]
        ]

    # Ready names it too once the rest of the service is up (the dispatcher of a workers' case starts meanwhile).
    found, ready = wait_for(
        lambda: (condition(kubectl, namespace, name, case.condition), condition(kubectl, namespace, name, "Ready")),
        TIMEOUT,
        f"{case.condition} and Ready to say {case.reason} on {name}",
        until=lambda both: both[0].get("reason") == both[1].get("reason") == case.reason,
        show=lambda: (condition(kubectl, namespace, name, case.condition), pods()),
    )
    assert found["status"] == "False"
    for words in case.says:
        assert words in found["message"], found
    assert (ready["status"], ready["message"]) == ("False", found["message"])


def test_a_problem_fixed_is_no_longer_reported(kubectl: Kubectl, namespace: str, applied: dict[str, Case]) -> None:
    """Once the PriorityClass exists, the StatefulSet creates its pods and the condition moves on."""
    wait_for(
        lambda: condition(kubectl, namespace, "no-priority", "WorkersReady").get("reason"),
        TIMEOUT,
        "WorkersReady=FailedCreate on no-priority",
        until=lambda reason: reason == "FailedCreate",
    )
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "does-not-exist"}, "value": 1000}  # fmt: skip
    kubectl.apply(priority)
    try:
        # No kwok toleration: the created pods are now held by the node's taint, which the condition says instead.
        found = wait_for(
            lambda: condition(kubectl, namespace, "no-priority", "WorkersReady"),
            TIMEOUT,
            "WorkersReady to stop saying FailedCreate",
            until=lambda c: c.get("reason") == "Unschedulable",
            show=lambda: condition(kubectl, namespace, "no-priority", "WorkersReady"),
        )
        assert "untolerated taint" in found["message"], found
    finally:
        kubectl.run("delete", "priorityclass", "does-not-exist", "--ignore-not-found")
