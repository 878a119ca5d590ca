"""What the kind tests share: the services they make, the pods they run, and how they wait."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tfdata_operator import __version__

from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, wait_for

SERVER_IMAGE = f"tfdata-server:{__version__}"  # kind/cluster.sh loads it
READY_TIMEOUT = 300
HOSTNAME = "kubernetes.io/hostname"


def tfdata_service(name: str) -> dict[str, Any]:
    """examples/dynamic.yaml, scaled down to fit one 2-core node next to the control plane."""
    return {
        "apiVersion": API_VERSION,
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


SHARED_MOUNT = "/var/lib/tfdata-shared"  # kind/cluster.sh mounts it in every node


def shared_claim(kubectl: Kubectl, namespace: str, volume: str, claim: str = "shared") -> str:
    """A ReadWriteMany claim ``claim`` bound to a hostPath volume ``volume`` on the directory every
    node mounts: what an NFS or cloud file store volume is on a real cluster. Delete the volume after."""
    kubectl.apply({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": SHARED_MOUNT, "type": "Directory"},
                 "claimRef": {"namespace": namespace, "name": claim}},
    })  # fmt: skip
    kubectl.apply({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    return claim


def start_pod(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    labels: dict[str, str],
    script: str,
    *args: str,
    pod_spec: dict[str, Any] | None = None,
    **container: Any,
) -> None:
    """A pod from our server image (it has Python, TensorFlow and our package) running ``script``;
    ``container`` adds to its container (``envFrom=...``, another ``image=...``), ``pod_spec`` to
    its spec (``initContainers``, ``volumes``)."""
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
            **(pod_spec or {}),
        },
    }
    kubectl.apply(pod)


# Saves (i, i*i + 7) for i in range(elements) to a tf.data snapshot through a service, or loads it back.
SNAPSHOT_TRAINER = (Path(__file__).resolve().parents[1] / "e2e" / "clients" / "snapshot_dataset.py").read_text()


def snapshot_trainer(
    kubectl: Kubectl, namespace: str, pod: str, service: str, *args: str, node: str | None = None
) -> str:
    """Runs SNAPSHOT_TRAINER (``args``) in a pod (on ``node``) with the settings of the TFDataService
    ``service`` and the claim "shared" at /snapshots (``shared_claim``); its log, once it succeeded."""
    pod_spec: dict[str, Any] = {"volumes": [{"name": "snapshots", "persistentVolumeClaim": {"claimName": "shared"}}]}
    if node is not None:
        pod_spec["nodeSelector"] = {HOSTNAME: node}
    start_pod(
        kubectl, namespace, pod, {"tfdata.dev/client": service}, SNAPSHOT_TRAINER, *args,
        envFrom=[{"configMapRef": {"name": f"{service}-client"}}],
        volumeMounts=[{"name": "snapshots", "mountPath": "/snapshots"}], pod_spec=pod_spec,
    )  # fmt: skip
    phase, log = wait_finished(kubectl, namespace, pod, 300)
    assert phase == "Succeeded", log[-3000:]
    return log


def snapshot_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The status of the TFDataSnapshot ``name`` ({} before the operator wrote one)."""
    return (kubectl.get("tfdatasnapshot", name, "-n", namespace) or {}).get("status") or {}


# Reads range(count) through the service under a sharding policy (DYNAMIC, or a static one), one
# line per element, pausing between elements so that a test can act mid-read.
READER = """
import sys, time
import tensorflow as tf
service, count, pause, policy = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
mode = "distributed_epoch" if policy == "DYNAMIC" else getattr(tf.data.experimental.service.ShardingPolicy, policy)
dataset = tf.data.Dataset.range(count).apply(
    tf.data.experimental.service.distribute(processing_mode=mode, service=service))
for element in dataset:
    print("element", int(element), flush=True)
    time.sleep(pause)
print("done", flush=True)
"""


def start_reader(
    kubectl: Kubectl,
    namespace: str,
    pod: str,
    service: str,
    count: int,
    pause: float,
    node: str,
    at_least: int = 0,
) -> str:
    """A READER pod on ``node`` for the TFDataService ``service`` (its sharding policy); once it has
    read ``at_least`` elements, returns the dispatcher's address."""
    svc = kubectl.json("get", f"tfdata/{service}", "-n", namespace)
    address, policy = svc["status"]["dispatcherAddress"], svc["spec"]["shardingPolicy"]
    labels = {"tfdata.dev/client": service}
    args = (address, str(count), str(pause), policy)
    start_pod(kubectl, namespace, pod, labels, READER, *args, pod_spec={"nodeSelector": {HOSTNAME: node}})
    wait_for(
        lambda: len(elements(logs(kubectl, namespace, pod))) >= at_least, 240, f"{pod} read {at_least} elements",
        interval=1, show=lambda: logs(kubectl, namespace, pod)[-2000:],
    )  # fmt: skip
    return str(address)


def readiness(kubectl: Kubectl, namespace: str, name: str) -> dict[str, bool]:
    """Whether each pod of the TFDataService ``name`` is Ready, by pod name."""
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"]
    return {
        p["metadata"]["name"]: any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])
        )
        for p in pods
    }


def pod_nodes(kubectl: Kubectl, namespace: str, name: str) -> dict[str, str]:
    """The node of each pod of the TFDataService ``name`` (not being deleted), by pod name."""
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"]
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods if not p["metadata"].get("deletionTimestamp")
    }


def whole_off(kubectl: Kubectl, namespace: str, name: str, workers: int, away: str) -> bool:
    """The service ``name`` is Ready with every pod Ready, ``workers`` workers among them, and no pod
    on the node ``away`` (drained, or lost)."""
    svc = kubectl.json("get", f"tfdata/{name}", "-n", namespace)
    conditions = {c["type"]: c["status"] for c in svc.get("status", {}).get("conditions", [])}
    pods = readiness(kubectl, namespace, name)
    placed = pod_nodes(kubectl, namespace, name)
    return (
        conditions.get("Ready") == "True"
        and sum(1 for pod in pods if "-worker-" in pod) == workers
        and all(pods.values())
        and away not in placed.values()
    )


def listing(kubectl: Kubectl, namespace: str) -> str:
    """The namespace's services, pods and claims, with their nodes: what a wait shows when it gives up."""
    return kubectl.run("get", "tfdata,pods,pvc", "-n", namespace, "-o", "wide", check=False).stdout


def schedulable_nodes(kubectl: Kubectl) -> list[str]:
    """The cluster's Ready nodes that take pods (not cordoned, no NoSchedule taint)."""
    names = []
    for node in kubectl.json("get", "nodes")["items"]:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        tainted = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in node["spec"].get("taints", []))
        if ready and not tainted and not node["spec"].get("unschedulable"):
            names.append(node["metadata"]["name"])
    return sorted(names)


def wait_schedulable(kubectl: Kubectl, count: int, timeout: float = 180) -> list[str]:
    """Waits until ``count`` nodes take pods (a thawed node is Ready a few seconds before the node
    lifecycle controller lifts its taints) and returns them."""
    return wait_for(
        lambda: names if len(names := schedulable_nodes(kubectl)) >= count else None, timeout,
        f"{count} schedulable nodes (kind/cluster.sh up with KIND_NODES={count})", interval=2,
        show=lambda: kubectl.run("get", "nodes", "-o", "custom-columns=NAME:.metadata.name,TAINTS:.spec.taints",
                                 check=False).stdout,
    )  # fmt: skip


def elements(log: str) -> list[int]:
    """What a reader script printed: one ``element N`` line per element."""
    return [int(line.split()[1]) for line in log.splitlines() if line.startswith("element ")]


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
# Arguments: host, port, and optionally the connect timeout (10 s) and the exit code of a failure
# (3: a pod's phase says it; 0 under `kubectl exec`, which reads only the word).
CONNECT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
failed = int(sys.argv[4]) if len(sys.argv) > 4 else 3
try:
    address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
except OSError as exc:
    print("dns", exc); sys.exit(failed)
try:
    socket.create_connection(address, timeout=timeout).close()
except TimeoutError as exc:
    print("timeout", address, exc); sys.exit(failed)
except ConnectionRefusedError as exc:
    print("refused", address, exc); sys.exit(failed)
except OSError as exc:
    print("error", address, exc); sys.exit(failed)
print("connected", address)
"""


def connect_from_pod(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    labels: dict[str, str],
    target: str,
    pod_spec: dict[str, Any] | None = None,
) -> str:
    """Runs a pod that opens a TCP connection to `target` (host:port); returns its log, whose
    first word is the outcome: connected, timeout, refused, dns or error."""
    host, port = target.rsplit(":", 1)
    start_pod(kubectl, namespace, name, labels, CONNECT, host, port, pod_spec=pod_spec)
    phase, log = wait_finished(kubectl, namespace, name, 120)
    log = log.strip()
    outcome = log.split(" ", 1)[0]
    assert outcome in ("connected", "timeout", "refused", "dns", "error"), f"unexpected output of {name}: {log!r}"
    assert (phase == "Succeeded") == (outcome == "connected"), f"{name} ended {phase} with {log!r}"
    return log


def wait_ready(kubectl: Kubectl, namespace: str, name: str, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        svc = kubectl.json("get", f"tfdata/{name}", "-n", namespace)
        conditions = {c["type"]: c for c in svc.get("status", {}).get("conditions", [])}
        return svc if conditions.get("Ready", {}).get("status") == "True" else None

    def show() -> str:
        return kubectl.run("get", f"tfdata/{name}", "pods,pvc", "-n", namespace, "-o", "wide", check=False).stdout

    return wait_for(ready, timeout, f"tfdata/{name} Ready", interval=2, show=show)
