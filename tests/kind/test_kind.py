"""A TFDataService on a real kind node: real kubelet, containerd, storage and network policy.

What only a real node shows: the dispatcher and worker pods from our server image get
Ready (TensorFlow servers answering the kubelet's probes), the dispatcher's journal
claim is bound by the cluster's provisioner (local-path-provisioner), and the
NetworkPolicy the operator writes is enforced by the cluster's network plugin.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import Kubectl, holds_for, wait_for

from tfdata_operator import __version__

NAME = "kindsvc"
AUTOSCALING_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "autoscaling.yaml"
SERVER_IMAGE = f"tfdata-server:{__version__}"  # hack/kind/cluster.sh loads it
READY_TIMEOUT = 300


def tfdata_service(name: str) -> dict[str, Any]:
    """examples/dynamic.yaml, scaled down to fit one 2-core node next to the control plane."""
    return {
        "apiVersion": "tfdata.dev/v1alpha1",
        "kind": "TFDataService",
        "metadata": {"name": name},
        "spec": {
            "shardingPolicy": "DYNAMIC",
            "dispatcher": {"faultTolerantMode": True, "storage": {"size": "1Gi"}},
            "workers": {
                "replicas": 2,
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
            },
        },
    }


@pytest.fixture(scope="module")
def ready_service(kubectl: Kubectl, namespace: str) -> str:
    kubectl.apply({**tfdata_service(NAME), "metadata": {"name": NAME, "namespace": namespace}})
    result = kubectl.run(
        "wait", "--for=condition=Ready", f"tfdata/{NAME}", "-n", namespace,
        f"--timeout={READY_TIMEOUT}s", check=False, timeout=READY_TIMEOUT + 30,
    )  # fmt: skip
    if result.returncode != 0:
        pods = kubectl.run("get", "pods,pvc,events", "-n", namespace, "-o", "wide", check=False).stdout
        status = kubectl.run("get", f"tfdata/{NAME}", "-n", namespace, "-o", "yaml", check=False).stdout
        pytest.fail(f"tfdata/{NAME} not Ready after {READY_TIMEOUT}s: {result.stderr}\n{status}\n{pods}")
    return namespace


def test_dispatcher_and_workers_get_ready(kubectl: Kubectl, ready_service: str) -> None:
    svc = kubectl.json("get", f"tfdata/{NAME}", "-n", ready_service)
    conditions = {c["type"]: c["status"] for c in svc["status"]["conditions"]}
    assert conditions == {"Ready": "True", "DispatcherReady": "True", "WorkersReady": "True"}, svc["status"]
    pods = kubectl.json("get", "pods", "-n", ready_service, "-l", f"app.kubernetes.io/instance={NAME}")["items"]
    ready = sorted(
        p["metadata"]["name"]
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    )
    assert ready == [f"{NAME}-dispatcher-0", f"{NAME}-worker-0", f"{NAME}-worker-1"], pods


def test_journal_claim_is_bound_by_local_path_provisioner(kubectl: Kubectl, ready_service: str) -> None:
    claim = kubectl.json("get", "pvc", f"journal-{NAME}-dispatcher-0", "-n", ready_service)
    assert claim["status"]["phase"] == "Bound", claim["status"]
    volume = kubectl.json("get", "pv", claim["spec"]["volumeName"])
    annotations = volume["metadata"].get("annotations", {})
    assert annotations.get("pv.kubernetes.io/provisioned-by") == "rancher.io/local-path", annotations


def start_pod(
    kubectl: Kubectl, namespace: str, name: str, labels: dict[str, str], script: str, *args: str, **container: Any
) -> None:
    """A pod from our server image (it has Python, TensorFlow and our package) running ``script``;
    ``container`` adds to its container (``envFrom=...``)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "client",
                    "image": SERVER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script, *args],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                    **container,
                }
            ],
        },
    }
    kubectl.apply(pod)


def logs(kubectl: Kubectl, namespace: str, name: str) -> str:
    return kubectl.run("logs", name, "-n", namespace, check=False).stdout


def wait_finished(kubectl: Kubectl, namespace: str, name: str, timeout: float) -> tuple[str, str]:
    """Waits for a pod from ``start_pod`` to end; returns its phase and log, and deletes it."""
    deadline = time.monotonic() + timeout
    while True:
        phase = kubectl.json("get", "pod", name, "-n", namespace)["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            described = kubectl.run("describe", "pod", name, "-n", namespace, check=False).stdout
            pytest.fail(f"pod {name} did not finish in {timeout:.0f}s (phase {phase}):\n{described}")
        time.sleep(1)
    log = logs(kubectl, namespace, name)
    kubectl.run("delete", "pod", name, "-n", namespace, "--wait=false")
    return phase, log


# What a client pod saw when it opened a TCP connection, one word: the script below prints it.
# kube-network-policies (kind's NetworkPolicy plugin) gives a denied connection's first packet an
# NFQUEUE drop verdict, so a denied client sees its SYN go unanswered: a connect timeout. A
# refusal (nothing listening), a DNS failure or any other error is not enforcement.
CONNECT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
except OSError as exc:
    print("dns", exc); sys.exit(3)
try:
    socket.create_connection(address, timeout=10).close()
except TimeoutError as exc:
    print("timeout", address, exc); sys.exit(3)
except ConnectionRefusedError as exc:
    print("refused", address, exc); sys.exit(3)
except OSError as exc:
    print("error", address, exc); sys.exit(3)
print("connected", address)
"""


def connect_from_pod(kubectl: Kubectl, namespace: str, name: str, labels: dict[str, str], target: str) -> str:
    """Runs a pod that opens a TCP connection to `target` (host:port); returns its log, whose
    first word is the outcome: connected, timeout, refused, dns or error."""
    host, port = target.rsplit(":", 1)
    start_pod(kubectl, namespace, name, labels, CONNECT, host, port)
    phase, log = wait_finished(kubectl, namespace, name, 120)
    log = log.strip()
    outcome = log.split(" ", 1)[0]
    assert outcome in ("connected", "timeout", "refused", "dns", "error"), f"unexpected output of {name}: {log!r}"
    assert (phase == "Succeeded") == (outcome == "connected"), f"{name} ended {phase} with {log!r}"
    return log


def test_network_policy_admits_only_labelled_clients(kubectl: Kubectl, ready_service: str) -> None:
    policies = kubectl.json("get", "networkpolicies", "-n", ready_service)["items"]
    assert policies, "the operator wrote no NetworkPolicy"
    svc = kubectl.json("get", f"tfdata/{NAME}", "-n", ready_service)
    target = svc["status"]["dispatcherAddress"].removeprefix("grpc://")

    # Right before the denied attempt: the name resolves and the dispatcher accepts connections.
    allowed = connect_from_pod(kubectl, ready_service, "client-labelled", {"tfdata.dev/client": NAME}, target)
    assert allowed.startswith("connected"), (
        f"a pod labelled tfdata.dev/client={NAME} could not reach the dispatcher at {target}: {allowed}"
    )

    denied = connect_from_pod(kubectl, ready_service, "client-unlabelled", {"app": "other"}, target)
    assert denied.startswith("timeout"), (
        f"a pod without tfdata.dev/client={NAME} should have its connection to {target} dropped by the "
        f"NetworkPolicy {json.dumps(policies[0]['spec'])} (a connect timeout); it saw: {denied}"
    )


# A trainer that knows only the service's name: its settings come from envFrom alone.
TRAINER = """
import json, os, sys
import tensorflow as tf
from tfdata_operator.client import distribute
print("settings", json.dumps({k: v for k, v in os.environ.items() if k.startswith("TFDATA_")}), flush=True)
dataset = tf.data.Dataset.range(int(sys.argv[2])).apply(distribute(sys.argv[1], job_name="envfrom"))
print("elements", json.dumps(sorted(int(x) for x in dataset)), flush=True)
"""


def test_a_trainer_pod_finds_the_service_through_envfrom(kubectl: Kubectl, ready_service: str) -> None:
    ns = ready_service
    env_from = [{"configMapRef": {"name": f"{NAME}-client"}}]
    start_pod(kubectl, ns, "trainer", {"tfdata.dev/client": NAME}, TRAINER, NAME, "50", envFrom=env_from)
    phase, log = wait_finished(kubectl, ns, "trainer", 240)
    lines = dict(line.split(" ", 1) for line in log.splitlines() if line.startswith(("settings ", "elements ")))
    assert phase == "Succeeded" and "elements" in lines, log[-3000:]
    published = kubectl.json("get", "configmap", f"{NAME}-client", "-n", ns)["data"]
    assert json.loads(lines["settings"]) == published, "the pod's TFDATA_* variables are the ConfigMap's"
    address = kubectl.json("get", f"tfdata/{NAME}", "-n", ns)["status"]["dispatcherAddress"]
    assert published["TFDATA_SERVICE_ADDRESS"] == address
    assert json.loads(lines["elements"]) == list(range(50)), lines["elements"]


# A slow DYNAMIC reader of range(COUNT): one line per element, so the test sees its progress.
READER = """
import sys, time
import tensorflow as tf
service, count = sys.argv[1], int(sys.argv[2])
dataset = tf.data.Dataset.range(count).apply(
    tf.data.experimental.service.distribute(processing_mode="distributed_epoch", service=service))
for element in dataset:
    print("element", int(element), flush=True)
    time.sleep(0.1)
print("done", flush=True)
"""
COUNT = 400


def elements(log: str) -> list[int]:
    return [int(line.split()[1]) for line in log.splitlines() if line.startswith("element ")]


def test_journal_on_the_claim_survives_deleting_the_dispatcher_mid_epoch(kubectl: Kubectl, ready_service: str) -> None:
    """Fault tolerance on a real node: the new dispatcher pod replays the journal from the same
    local-path volume, and the client finishes its epoch with nothing lost and nothing repeated."""
    ns = ready_service
    svc = kubectl.json("get", f"tfdata/{NAME}", "-n", ns)
    claim = f"journal-{NAME}-dispatcher-0"
    volume = kubectl.json("get", "pvc", claim, "-n", ns)["spec"]["volumeName"]
    address = svc["status"]["dispatcherAddress"]
    start_pod(kubectl, ns, "reader", {"tfdata.dev/client": NAME}, READER, address, str(COUNT))
    deadline = time.monotonic() + 240
    while len(elements(logs(kubectl, ns, "reader"))) < 40:
        if time.monotonic() > deadline:
            pods = kubectl.run("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
            pytest.fail(f"the reader got fewer than 40 elements in 240s:\n{logs(kubectl, ns, 'reader')}\n{pods}")
        time.sleep(1)

    dispatcher = f"{NAME}-dispatcher-0"
    old_uid = kubectl.json("get", "pod", dispatcher, "-n", ns)["metadata"]["uid"]
    kubectl.run("delete", "pod", dispatcher, "-n", ns, "--wait=false")
    phase, log = wait_finished(kubectl, ns, "reader", 300)
    assert phase == "Succeeded" and log.rstrip().endswith("done"), log[-2000:]
    got = elements(log)
    assert sorted(got) == list(range(COUNT)), (
        f"{len(got)} elements, {len(set(got))} distinct; missing {sorted(set(range(COUNT)) - set(got))[:20]}"
    )
    restarted = kubectl.json("get", "pod", dispatcher, "-n", ns)
    assert restarted["metadata"]["uid"] != old_uid, "the dispatcher pod was not replaced"
    assert kubectl.json("get", "pvc", claim, "-n", ns)["spec"]["volumeName"] == volume
    assert "replaying the journal" in logs(kubectl, ns, dispatcher)


HELD = "kindheld"
# A slow DATA-sharded reader: DATA is static sharding, so a change of the worker list would break it.
STATIC_READER = """
import sys, time
import tensorflow as tf
service, count, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
dataset = tf.data.Dataset.range(count).apply(tf.data.experimental.service.distribute(
    processing_mode=tf.data.experimental.service.ShardingPolicy.DATA, service=service))
for element in dataset:
    print("element", int(element), flush=True)
    time.sleep(pause)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def static_service(kubectl: Kubectl, namespace: str) -> str:
    """A DATA-sharded service with one worker and a journal claim (rescalePolicy: the default, WhenIdle)."""
    body = tfdata_service(HELD)
    body["metadata"]["namespace"] = namespace
    body["spec"]["shardingPolicy"] = "DATA"
    body["spec"]["workers"]["replicas"] = 1
    kubectl.apply(body)
    wait_ready(kubectl, namespace, HELD)
    return namespace


def wait_ready(kubectl: Kubectl, namespace: str, name: str, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        svc = kubectl.json("get", f"tfdata/{name}", "-n", namespace)
        conditions = {c["type"]: c for c in svc.get("status", {}).get("conditions", [])}
        return svc if conditions.get("Ready", {}).get("status") == "True" else None

    def show() -> str:
        return kubectl.run("get", f"tfdata/{name}", "pods,pvc", "-n", namespace, "-o", "wide", check=False).stdout

    return wait_for(ready, timeout, f"tfdata/{name} Ready", interval=2, show=show)


def instance_pods(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    items = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"]
    return sorted(p["metadata"]["name"] for p in items)


def test_a_static_rescale_waits_for_the_reader_then_goes_ahead(kubectl: Kubectl, static_service: str) -> None:
    """Under a real kubelet: `kubectl scale` mid-read is held (status and event say so), the reader
    reads every element exactly once, and the change is carried out within 30 s after it ends."""
    ns, count = static_service, 200
    address = kubectl.json("get", f"tfdata/{HELD}", "-n", ns)["status"]["dispatcherAddress"]
    start_pod(kubectl, ns, "static-reader", {"tfdata.dev/client": HELD}, STATIC_READER, address, str(count), "0.15")
    wait_for(
        lambda: len(elements(logs(kubectl, ns, "static-reader"))) >= 20, 240, "the reader read 20 elements",
        interval=1, show=lambda: logs(kubectl, ns, "static-reader")[-2000:],
    )  # fmt: skip
    kubectl.run("scale", f"tfdata/{HELD}", "-n", ns, "--replicas=2")

    def held() -> dict[str, Any] | None:
        return kubectl.json("get", f"tfdata/{HELD}", "-n", ns).get("status", {}).get("held")

    waiting = wait_for(held, 60, "status.held", interval=1)
    assert waiting["change"] == "workers 1→2" and "rescalePolicy: Immediate" in waiting["message"], waiting
    holds_for(
        lambda: kubectl.json("get", "statefulset", f"{HELD}-worker", "-n", ns)["spec"]["replicas"], 5,
        "the worker StatefulSet keeps 1 replica while the reader reads", ok=lambda replicas: replicas == 1,
    )  # fmt: skip

    phase, log = wait_finished(kubectl, ns, "static-reader", 300)
    ended = time.monotonic()
    got = elements(log)
    assert phase == "Succeeded" and sorted(got) == list(range(count)), (phase, log[-2000:])
    wait_for(lambda: held() is None, 30, "the held change carried out within 30 s of the reader's end", interval=1)
    print(f"held change carried out {time.monotonic() - ended:.1f}s after the reader ended")
    svc = wait_ready(kubectl, ns, HELD)
    assert svc["status"]["workers"]["readyReplicas"] == 2, svc["status"]
    events = kubectl.run("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={HELD}").stdout
    assert "RescaleHeld" in events and "HeldChangeCarriedOut" in events, events


def test_suspend_removes_every_pod_and_resume_reads_again(kubectl: Kubectl, static_service: str) -> None:
    ns = static_service
    before = kubectl.json("get", f"tfdata/{HELD}", "-n", ns)["status"]["dispatcherAddress"]
    claim = f"journal-{HELD}-dispatcher-0"
    volume = kubectl.json("get", "pvc", claim, "-n", ns)["spec"]["volumeName"]
    kubectl.run("patch", f"tfdata/{HELD}", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: not instance_pods(kubectl, ns, HELD), 120, "every pod of the suspended service gone", interval=1)
    svc = kubectl.json("get", f"tfdata/{HELD}", "-n", ns)
    conditions = {c["type"]: c for c in svc["status"]["conditions"]}
    assert conditions["Suspended"]["status"] == "True", conditions
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "Suspended"), conditions
    assert svc["status"]["dispatcherAddress"] == before
    assert kubectl.json("get", "pvc", claim, "-n", ns)["spec"]["volumeName"] == volume
    kubectl.run("get", "service", f"{HELD}-dispatcher", "-n", ns)

    kubectl.run("patch", f"tfdata/{HELD}", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    svc = wait_ready(kubectl, ns, HELD)
    assert svc["status"]["dispatcherAddress"] == before
    start_pod(kubectl, ns, "after-resume", {"tfdata.dev/client": HELD}, STATIC_READER, before, "60", "0")
    phase, log = wait_finished(kubectl, ns, "after-resume", 240)
    assert phase == "Succeeded" and sorted(elements(log)) == list(range(60)), log[-2000:]
    assert "replaying the journal" in logs(kubectl, ns, f"{HELD}-dispatcher-0")


# --- Autoscaling under a real kubelet ---------------------------------------------------------

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
        {"apiVersion": "tfdata.dev/v1alpha1", "kind": "TFDataService",
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
    (metric,) = hpa["status"]["currentMetrics"]
    assert metric["resource"]["name"] == "cpu", hpa["status"]
    assert hpa["status"]["desiredReplicas"] >= 2, hpa["status"]
    sts = kubectl.json("get", "statefulset", f"{name}-worker", "-n", namespace)
    assert sts["status"]["readyReplicas"] >= 2, sts["status"]
    print(f"\nCPU autoscaling: 2 ready workers {took:.0f}s after the reader started; the HPA saw {metric}")
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
