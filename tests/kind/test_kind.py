"""A TFDataService on a real kind node: real kubelet, containerd, storage and network policy.

What only a real node shows: the dispatcher and worker pods from our server image get
Ready (TensorFlow servers answering the kubelet's probes), the dispatcher's journal
claim is bound by the cluster's provisioner (local-path-provisioner), and the
NetworkPolicy the operator writes is enforced by the cluster's network plugin.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kindpods import (
    READY_TIMEOUT,
    connect_from_pod,
    elements,
    logs,
    readiness,
    start_pod,
    tfdata_service,
    wait_finished,
    wait_ready,
)

from fixtures.support import Kubectl, holds_for, wait_for

NAME = "kindsvc"


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
    ready = readiness(kubectl, ready_service, NAME)
    assert ready == {f"{NAME}-dispatcher-0": True, f"{NAME}-worker-0": True, f"{NAME}-worker-1": True}, ready


def test_journal_claim_is_bound_by_local_path_provisioner(kubectl: Kubectl, ready_service: str) -> None:
    claim = kubectl.json("get", "pvc", f"journal-{NAME}-dispatcher-0", "-n", ready_service)
    assert claim["status"]["phase"] == "Bound", claim["status"]
    volume = kubectl.json("get", "pv", claim["spec"]["volumeName"])
    annotations = volume["metadata"].get("annotations", {})
    assert annotations.get("pv.kubernetes.io/provisioned-by") == "rancher.io/local-path", annotations


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
