"""Autoscaling under a real kubelet: metric CPU through metrics-server and an HPA, metric TFData
through the operator's reads of the dispatcher's signals, with NetworkPolicies enforced.

Its own module, so its own namespace: this module runs first (files run in name order), on a
node whose CPU requests the other kind tests' services do not yet hold (a 2-core node).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kindpods import READY_TIMEOUT, connect_from_pod, start_pod, tfdata_service, wait_ready

from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl

AUTOSCALING_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "autoscaling.yaml"


# A reader that keeps the workers' CPU busy until its pod is deleted: 60 products of 256x256
# matrices per element, which start from the element and decide what is returned, so that the
# graph optimizer can neither fold them away nor prune them.
BURNER = """
import sys
import tensorflow as tf
service = sys.argv[1]
matrix = tf.random.stateless_uniform([256, 256], seed=[1, 2]) / 256.0
def burn(i):
    start = matrix + tf.cast(i, tf.float32) * 1e-9
    _, product = tf.while_loop(lambda k, m: k < 60, lambda k, m: (k + 1, tf.matmul(m, matrix)), [0, start])
    return tf.cond(tf.reduce_sum(product) > -1e30, lambda: i, lambda: i + 1)
dataset = tf.data.Dataset.range(10**9).map(burn).apply(
    tf.data.experimental.service.distribute(processing_mode="distributed_epoch", service=service))
for n, _ in enumerate(dataset):
    if n % 100 == 0:
        print("element", n, flush=True)
"""


def autoscaled_service(kubectl: Kubectl, namespace: str, name: str, autoscaling: dict[str, Any]) -> str:
    """A DYNAMIC service with one worker to start from (small requests: the node is shared); its address."""
    spec = tfdata_service(name)["spec"]
    spec["dispatcher"] = {}
    spec["workers"] = {"replicas": 1, "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}}}
    kubectl.apply(
        {"apiVersion": API_VERSION, "kind": "TFDataService",
         "metadata": {"name": name, "namespace": namespace}, "spec": {**spec, "autoscaling": autoscaling}}
    )  # fmt: skip
    waited = kubectl.run(
        "wait", "--for=condition=Ready", f"tfdata/{name}", "-n", namespace, f"--timeout={READY_TIMEOUT}s",
        check=False, timeout=READY_TIMEOUT + 30,
    )  # fmt: skip
    assert waited.returncode == 0, kubectl.run("get", "pods,events", "-n", namespace, check=False).stdout
    return str(kubectl.json("get", f"tfdata/{name}", "-n", namespace)["status"]["dispatcherAddress"])


def wait_workers(kubectl: Kubectl, namespace: str, name: str, done: Any, timeout: float, what: str) -> float:
    """Polls the service's ready workers until ``done(ready, replicas)``; returns the seconds it took."""
    started = time.monotonic()
    seen: list[tuple[int, int, int]] = []
    while True:
        svc = kubectl.json("get", f"tfdata/{name}", "-n", namespace)
        ready = int(str(svc.get("status", {}).get("workers", {}).get("summary", "0/0")).split("/")[0])
        replicas = int(svc["spec"]["workers"]["replicas"])
        if not seen or seen[-1][1:] != (ready, replicas):
            seen.append((round(time.monotonic() - started), ready, replicas))
        if done(ready, replicas):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            described = kubectl.run("describe", f"tfdata/{name}", "hpa", "-n", namespace, check=False).stdout
            pytest.fail(f"gave up after {timeout:.0f}s waiting for {what}; (s, ready, replicas): {seen}\n{described}")
        time.sleep(3)


def test_cpu_autoscaling_scales_the_workers_with_metrics_server(kubectl: Kubectl, namespace: str) -> None:
    """metric CPU: the HorizontalPodAutoscaler reads the workers' CPU from metrics-server (installed by
    `make kind-up`) and adds workers to the StatefulSet through the TFDataService's scale subresource."""
    name = "cpuscaled"
    autoscaling = {"metric": "CPU", "minReplicas": 1, "maxReplicas": 3, "targetCPUUtilizationPercentage": 80}
    address = autoscaled_service(kubectl, namespace, name, autoscaling)
    start_pod(kubectl, namespace, f"{name}-burner", {"tfdata.dev/client": name}, BURNER, address)
    took = wait_workers(kubectl, namespace, name, lambda ready, _: ready >= 2, 360, "2 ready workers")
    hpa = kubectl.json("get", "hpa", f"{name}-worker", "-n", namespace)
    assert hpa["status"]["desiredReplicas"] >= 2, hpa["status"]
    # The HPA's own account of why (its currentMetrics may be empty right after a scale, while the
    # new pods have no CPU reading yet).
    rescales = kubectl.run(
        "get", "events", "-n", namespace, "-o", "custom-columns=MESSAGE:.message",
        "--field-selector", "involvedObject.kind=HorizontalPodAutoscaler,reason=SuccessfulRescale",
    ).stdout  # fmt: skip
    assert "cpu resource utilization (percentage of request) above target" in rescales, rescales
    sts = kubectl.json("get", "statefulset", f"{name}-worker", "-n", namespace)
    assert sts["status"]["readyReplicas"] >= 2, sts["status"]
    said = rescales.strip().splitlines()[1:]
    print(f"\nCPU autoscaling: 2 ready workers {took:.0f}s after the reader started; the HPA: {said}")
    kubectl.run("delete", "pod", f"{name}-burner", "-n", namespace, "--wait=false")
    kubectl.run("delete", "tfdata", name, "-n", namespace, "--wait=true", "--timeout=120s", timeout=130)


def test_tfdata_autoscaling_reads_signals_through_the_enforced_network_policy(kubectl: Kubectl, namespace: str) -> None:
    """examples/autoscaling.yaml (metric TFData) as written, on a real node with NetworkPolicies
    enforced: the operator (in its own namespace) reads the dispatcher's /v1/signals through the
    rule the policy gives it, adds workers under a CPU-heavy read, and removes them once the
    reader is gone; a pod that is not the operator or a client cannot reach that port."""
    body = yaml.safe_load(AUTOSCALING_EXAMPLE.read_text())  # as a user would apply it
    name = body["metadata"]["name"]
    body["metadata"]["namespace"] = namespace
    kubectl.apply(body)
    address = wait_ready(kubectl, namespace, name)["status"]["dispatcherAddress"]
    policy = kubectl.json("get", "networkpolicy", name, "-n", namespace)
    operator_rules = [r for r in policy["spec"]["ingress"] if any("namespaceSelector" in p for p in r["from"])]
    assert len(operator_rules) == 1, policy["spec"]
    (peer,) = operator_rules[0]["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "tfdata-system"}}, peer
    operators = kubectl.json("get", "pods", "-n", "tfdata-system", "-l", "app.kubernetes.io/name=tfdata-operator")
    running = [p for p in operators["items"] if not p["metadata"].get("deletionTimestamp")]
    assert running and all(
        peer["podSelector"]["matchLabels"].items() <= p["metadata"]["labels"].items() for p in running
    )

    # The dispatcher pod's own address: its Services publish the gRPC port only.
    ip = kubectl.json("get", "pod", f"{name}-dispatcher-0", "-n", namespace)["status"]["podIP"]
    health = f"{ip}:{operator_rules[0]['ports'][0]['port']}"
    allowed = connect_from_pod(kubectl, namespace, f"{name}-client", {"tfdata.dev/client": name}, health)
    assert allowed.startswith("connected"), (
        f"a client pod could not reach the dispatcher's health port {health}: {allowed}"
    )
    denied = connect_from_pod(kubectl, namespace, f"{name}-stranger", {"app": "other"}, health)
    assert denied.startswith("timeout"), f"a pod that is neither the operator nor a client reached {health}: {denied}"

    start_pod(kubectl, namespace, f"{name}-burner", {"tfdata.dev/client": name}, BURNER, address)
    took = wait_workers(kubectl, namespace, name, lambda ready, _: ready >= 2, 300, "2 ready workers")
    status = kubectl.json("get", f"tfdata/{name}", "-n", namespace)["status"]["autoscaling"]
    assert status["signals"].get("error") is None and status["lastScale"]["toReplicas"] >= 2, status
    events = kubectl.run("describe", f"tfdata/{name}", "-n", namespace).stdout
    assert "Scaled workers from 1 to" in events, events
    print(f"\nTFData autoscaling: 2 ready workers {took:.0f}s after the reader started; {status['lastScale']}")

    kubectl.run("delete", "pod", f"{name}-burner", "-n", namespace, "--wait=false")
    back = wait_workers(kubectl, namespace, name, lambda _, replicas: replicas == 1, 180, "1 worker again")
    print(f"TFData autoscaling: back to 1 worker {back:.0f}s after the reader was deleted")
    kubectl.run("delete", "tfdata", name, "-n", namespace, "--wait=true", "--timeout=120s", timeout=130)
