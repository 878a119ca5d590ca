"""spec.networkPolicy.egress on a real network plugin (kube-network-policies on kind).

With egress restricted, the servers still reach each other and DNS (the service gets Ready, and
the dispatcher opens a worker's gRPC port by its DNS name), and they reach an address outside the
pods until `except` names it. The address is a hostNetwork pod of this test's on the other node:
its IP is that node's, which no pod selector matches, as the cloud metadata server is matched by
none. (A pod's own address stays reachable whatever `except` says: the rule admits every pod.)
The test sends traffic only to its own pods.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kindpods import CONNECT, READY_TIMEOUT, SERVER_IMAGE, tfdata_service, wait_ready, wait_schedulable

from fixtures.support import Kubectl, holds_for, wait_for

NAME = "egress"
PORT = 39471  # the target's port on its node: a hostNetwork pod takes one of the node's own
METADATA = ["169.254.169.254/32", "fd00:ec2::254/128"]

# A TCP listener that accepts and closes, for as long as the pod runs.
LISTEN = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.listen(64)
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""


def connect_from(kubectl: Kubectl, namespace: str, pod: str, host: str, port: int) -> str:
    """What a connection from the dispatcher container of ``pod`` to host:port did: connected, timeout,
    refused, dns or error (``kindpods.CONNECT``), and the rest of the line."""
    argv = ["exec", "-n", namespace, pod, "-c", "dispatcher", "--", "python3", "-c", CONNECT, host, str(port)]
    result = kubectl.run(*argv, "5", "0", timeout=60)  # a 5 s connect; a failure is a word, not an exit code
    line = result.stdout.strip()
    assert line.split(" ", 1)[0] in ("connected", "timeout", "refused", "dns", "error"), f"unexpected output: {line!r}"
    return line


def egress_policy(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    (policy,) = kubectl.json("get", "networkpolicies", "-n", namespace)["items"]
    return policy["spec"]


@pytest.fixture(scope="module")
def restricted(kubectl: Kubectl, namespace: str) -> str:
    svc = tfdata_service(NAME)
    svc["metadata"]["namespace"] = namespace
    svc["spec"]["workers"]["replicas"] = 1
    svc["spec"]["networkPolicy"] = {"egress": {"enabled": True}}
    kubectl.apply(svc)
    wait_ready(kubectl, namespace, NAME, READY_TIMEOUT)
    return namespace


def start_target(kubectl: Kubectl, namespace: str, away_from: str) -> str:
    """The hostNetwork listener on a node other than ``away_from``; returns its (the node's) IP."""
    others = [n for n in wait_schedulable(kubectl, 2) if n != away_from]
    kubectl.apply({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "egress-target", "namespace": namespace, "labels": {"app": "egress-target"}},
        "spec": {
            "nodeName": others[0],
            "hostNetwork": True,
            "restartPolicy": "Never",
            "containers": [{
                "name": "listen",
                "image": SERVER_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["python3", "-c", LISTEN, str(PORT)],
                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 2},
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
            }],
        },
    })  # fmt: skip

    def ready() -> str | None:
        pod = kubectl.json("get", "pod", "egress-target", "-n", namespace)
        ok = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        return pod["status"].get("podIP") if ok else None

    def show() -> str:
        return kubectl.run("describe", "pod", "egress-target", "-n", namespace, check=False).stdout

    return wait_for(ready, 120, "the hostNetwork listener Ready", interval=1, show=show)


def test_restricted_egress_reaches_the_pods_and_dns_and_all_but_except(kubectl: Kubectl, restricted: str) -> None:
    ns = restricted
    spec = egress_policy(kubectl, ns)
    assert spec["policyTypes"] == ["Ingress", "Egress"], spec
    dispatcher = f"{NAME}-dispatcher-0"

    # Each other and DNS: the service got Ready (the worker registered with the dispatcher by its
    # name), and the dispatcher opens the worker's gRPC port by the worker's DNS name.
    worker = f"{NAME}-worker-0.{NAME}-worker.{ns}.svc.cluster.local"
    seen = connect_from(kubectl, ns, dispatcher, worker, 5051)
    assert seen.startswith("connected"), (
        f"the dispatcher could not reach {worker}:5051 under {json.dumps(spec)}: {seen}"
    )

    node = kubectl.json("get", "pod", dispatcher, "-n", ns)["spec"]["nodeName"]
    target = start_target(kubectl, ns, node)
    seen = connect_from(kubectl, ns, dispatcher, target, PORT)
    assert seen.startswith("connected"), (
        f"with except {METADATA}, the dispatcher should reach {target}:{PORT} (a node's address): {seen}"
    )

    kubectl.run(
        "patch", f"tfdata/{NAME}", "-n", ns, "--type=merge",
        "-p", json.dumps({"spec": {"networkPolicy": {"egress": {"except": [*METADATA, f"{target}/32"]}}}}),
    )  # fmt: skip
    wait_for(
        lambda: f"{target}/32" in json.dumps(egress_policy(kubectl, ns)["egress"]),
        60,
        f"the operator adding {target}/32 to the NetworkPolicy's except",
        interval=1,
        show=lambda: json.dumps(egress_policy(kubectl, ns)),
    )
    # The plugin decides on each new connection from its watch of the policy: the first attempts
    # may come before it saw the change.
    seen = wait_for(
        lambda: connect_from(kubectl, ns, dispatcher, target, PORT),
        90,
        f"the dispatcher's connections to {target}:{PORT} dropped once except names it",
        interval=1,
        until=lambda line: line.startswith("timeout"),
    )
    # And they stay dropped, while the servers still reach each other.
    holds_for(
        lambda: connect_from(kubectl, ns, dispatcher, target, PORT),
        15,
        f"the dispatcher's connections to {target}:{PORT} dropped",
        ok=lambda line: line.startswith("timeout"),
    )
    seen = connect_from(kubectl, ns, dispatcher, worker, 5051)
    assert seen.startswith("connected"), f"with {target}/32 excepted, the dispatcher lost its worker: {seen}"
    wait_ready(kubectl, ns, NAME, 60)
