"""A TFDataService on a real kind node: real kubelet, containerd, storage and network policy.

What only a real node shows: the dispatcher and worker pods from our server image get
Ready (TensorFlow servers answering the kubelet's probes), the dispatcher's journal
claim is bound by the cluster's provisioner (local-path-provisioner), and the
NetworkPolicy the operator writes is enforced by the cluster's network plugin.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Kubectl

NAME = "kindsvc"
SERVER_IMAGE_PROBE = "tfdata-server:0.1.0"
READY_TIMEOUT = 300
# hack/kind/cluster.sh labels nodes whose CNI enforces no NetworkPolicy.
UNENFORCED_LABEL = "tfdata.dev/networkpolicy"


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


def connect_from_pod(kubectl: Kubectl, namespace: str, name: str, labels: dict[str, str], target: str) -> bool:
    """Runs a pod that opens a TCP connection to `target` (host:port); True when it connected."""
    host, port = target.rsplit(":", 1)
    script = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {int(port)}), timeout=10).close()\n"
        "except OSError as exc:\n"
        "    print('refused:', exc); sys.exit(3)\n"
        "print('connected')\n"
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": SERVER_IMAGE_PROBE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                }
            ],
        },
    }
    kubectl.apply(pod)
    deadline = time.monotonic() + 120
    while True:
        phase = kubectl.json("get", "pod", name, "-n", namespace)["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            described = kubectl.run("describe", "pod", name, "-n", namespace, check=False).stdout
            pytest.fail(f"pod {name} did not finish in 120s (phase {phase}):\n{described}")
        time.sleep(1)
    log = kubectl.run("logs", name, "-n", namespace, check=False).stdout.strip()
    kubectl.run("delete", "pod", name, "-n", namespace, "--wait=false")
    assert log in ("connected",) or log.startswith("refused:"), f"unexpected output of {name}: {log!r}"
    return phase == "Succeeded"


def test_network_policy_admits_only_labelled_clients(kubectl: Kubectl, ready_service: str) -> None:
    nodes = kubectl.json("get", "nodes")["items"]
    if any(n["metadata"].get("labels", {}).get(UNENFORCED_LABEL) == "unenforced" for n in nodes):
        pytest.skip(
            f"the nodes say {UNENFORCED_LABEL}=unenforced: a node image built without kindnetd "
            "(see hack/kind/README.md) runs a CNI that does not enforce NetworkPolicies"
        )
    policies = kubectl.json("get", "networkpolicies", "-n", ready_service)["items"]
    assert policies, "the operator wrote no NetworkPolicy"
    svc = kubectl.json("get", f"tfdata/{NAME}", "-n", ready_service)
    target = svc["status"]["dispatcherAddress"].removeprefix("grpc://")

    allowed = connect_from_pod(kubectl, ready_service, "client-labelled", {"tfdata.dev/client": NAME}, target)
    assert allowed, f"a pod labelled tfdata.dev/client={NAME} could not reach the dispatcher at {target}"

    denied = not connect_from_pod(kubectl, ready_service, "client-unlabelled", {"app": "other"}, target)
    assert denied, (
        f"a pod without tfdata.dev/client={NAME} reached the dispatcher at {target}: the NetworkPolicy "
        f"{json.dumps(policies[0]['spec'])} is not enforced by this cluster's network plugin"
    )
