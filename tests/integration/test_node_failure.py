"""A node that stops answering, and the operator replacing its pods without a human (spec.nodeLoss).

A second kwok node joins the cluster for this module; two services place their pods there (a
required node affinity for a label that only that node carries at first; once the pods run there, the
other kwok nodes get the label too, so the replacements have somewhere to go). Then kwok stops
managing it (``stop``), so nothing renews its Lease or posts its status: the real node lifecycle
controller marks it Unknown after its --node-monitor-grace-period (50 s by default in v1.34, which the
dev cluster keeps), taints it node.kubernetes.io/unreachable and marks its pods not Ready, as it would
for a machine that lost power. From there it is the operator's: after replaceAfterSeconds

- ``recover`` (the default, Recover): its worker and its dispatcher are force-deleted and come back on
  the other node; the dispatcher's journal claim (kwok provisions hostPath volumes: reachable only
  from their node) is deleted first, so the dispatcher comes back on a new claim, and a Warning Event
  says that the running jobs were lost;
- ``waiting`` (dispatcher: Wait): its worker is replaced, its dispatcher is not, and the status and a
  Warning Event say what a person can do, which the test then does (a force delete).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import Kubectl, OperatorProcess, holds_for, kubelet_nodes, wait_for

import devcluster

# Cluster-wide, so a name of its own for sessions sharing a cluster.
NODE = f"lost-{secrets.token_hex(3)}"
# The label the pods require: on NODE from the start, on the other kwok nodes once the pods run on NODE.
# A preferred affinity for NODE alone lost to the scheduler's other scores (spreading, free resources)
# now and then, and a pod started on the node that is not lost.
PLACE = f"test.tfdata.dev/{NODE}"
# The node lifecycle controller's grace period (50 s), its 5 s period, the tainter's rate limit, and the
# replacements on a loaded 2-core machine.
LOSS_TIMEOUT = 180
REPLACE_AFTER = 5
HOLD_SECONDS = 6.0


def placed_there(replicas: int | None = None) -> dict[str, Any]:
    """Pod settings that run on kwok's nodes that carry PLACE: at first only the node this module loses."""
    required = {"nodeSelectorTerms": [{"matchExpressions": [{"key": PLACE, "operator": "Exists"}]}]}
    pod: dict[str, Any] = {
        "tolerations": [devcluster.KWOK_TOLERATION],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
    }
    return pod if replicas is None else {**pod, "replicas": replicas}


def service(name: str, namespace: str, **node_loss: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tfdata.dev/v1alpha1",
        "kind": "TFDataService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "shardingPolicy": "DYNAMIC",
            "nodeLoss": {"replaceAfterSeconds": REPLACE_AFTER, **node_loss},
            "dispatcher": placed_there(),
            "workers": placed_there(replicas=1),
        },
    }


@pytest.fixture(scope="module")
def node(kubectl: Kubectl) -> Iterator[str]:
    """A kwok node of this module's own, deleted afterwards (with it, the pods still bound to it)."""
    if kubelet_nodes(kubectl.json("get", "nodes")):
        pytest.skip("losing a node needs the dev cluster's kwok nodes (the multi-node kind tier stops real ones)")
    lost = devcluster.kwok_node(NODE)
    lost["metadata"].setdefault("labels", {})[PLACE] = "lost"
    kubectl.apply(lost)
    wait_for(lambda: ready(kubectl.get("node", NODE)), 60, f"kwok to make node {NODE} Ready")
    yield NODE
    kubectl.run("delete", "node", NODE, "--ignore-not-found", "--wait=true", "--timeout=60s", timeout=70)
    kubectl.run("label", "nodes", "--all", f"{PLACE}-")


def others(kubectl: Kubectl, node: str) -> list[str]:
    """The kwok nodes other than ``node``."""
    listed = kubectl.json("get", "nodes")["items"]
    return [n["metadata"]["name"] for n in listed if devcluster.is_kwok_node(n) and n["metadata"]["name"] != node]


def stop(kubectl: Kubectl, node: str) -> None:
    """kwok stops posting the node's status (the annotation it selects nodes by is gone) and renewing
    its Lease: kwok v0.8.0 renews a Lease only while it holds it or the holder's has expired
    (tryAcquireOrRenew, pkg/kwok/controllers/node_lease_controller.go), so another holder, for an
    hour, leaves its renewTime where it was. Its pods stay as they were, as on a machine that lost power."""
    kubectl.run("annotate", "node", node, f"{devcluster.KWOK_NODE_ANNOTATION}-")
    held = {"spec": {"holderIdentity": "tfdata-test-lost-node", "leaseDurationSeconds": 3600}}
    kubectl.run("patch", "lease", node, "-n", "kube-node-lease", "--type=merge", "-p", json.dumps(held))


def ready(obj: dict[str, Any] | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pods(kubectl: Kubectl, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kubectl.json("get", "pods", "-n", namespace)["items"]}


def where(kubectl: Kubectl, namespace: str) -> dict[str, tuple[str, str, bool]]:
    """Each pod's (uid, node, Ready)."""
    return {
        name: (p["metadata"]["uid"], p["spec"].get("nodeName", ""), ready(p))
        for name, p in pods(kubectl, namespace).items()
    }


def events(kubectl: Kubectl, namespace: str, name: str) -> list[tuple[str, str, str]]:
    selector = f"involvedObject.kind=TFDataService,involvedObject.name={name}"
    listed = kubectl.json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return [(e["type"], e["reason"], e["message"]) for e in listed]


def condition(kubectl: Kubectl, namespace: str, name: str, kind: str = "Ready") -> dict[str, Any]:
    conditions = (kubectl.get("tfdataservice", name, "-n", namespace).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def test_pods_of_an_unreachable_node_are_replaced_and_a_waiting_dispatcher_is_left_to_a_person(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node: str
) -> None:
    for name, setting in (("recover", {}), ("waiting", {"dispatcher": "Wait"})):
        kubectl.apply(service(name, namespace, **setting))
    names = {f"{s}-{part}-0" for s in ("recover", "waiting") for part in ("dispatcher", "worker")}
    before = wait_for(
        lambda: (
            (seen := where(kubectl, namespace)).keys() >= names
            and all(seen[n][1:] == (node, True) for n in names)
            and seen
        ),
        90,
        f"the four pods to run on {node}",
        show=lambda: where(kubectl, namespace),
    )
    claim = kubectl.get("pvc", "journal-recover-dispatcher-0", "-n", namespace)
    assert claim is not None and claim["status"]["phase"] == "Bound", claim
    elsewhere_nodes = others(kubectl, node)
    assert elsewhere_nodes, "the dev cluster has no other kwok node for the replacements"
    kubectl.run("label", "nodes", *elsewhere_nodes, f"{PLACE}=elsewhere")

    # The node stops answering: nothing renews its Lease or posts its status any more.
    stop(kubectl, node)
    stopped = time.monotonic()

    def tainted() -> float | None:
        taints = (kubectl.get("node", node).get("spec") or {}).get("taints") or []
        unreachable = any(t["key"] == "node.kubernetes.io/unreachable" and t["effect"] == "NoExecute" for t in taints)
        return time.monotonic() - stopped if unreachable else None

    taint_after = wait_for(tainted, LOSS_TIMEOUT, f"{node} to be tainted unreachable", interval=1,
                           show=lambda: kubectl.get("node", node).get("status", {}).get("conditions"))  # fmt: skip

    replaced = {"recover-dispatcher-0", "recover-worker-0", "waiting-worker-0"}

    def elsewhere() -> dict[str, tuple[str, str, bool]] | None:
        seen = where(kubectl, namespace)
        moved = all(n in seen and seen[n][0] != before[n][0] and seen[n][1] not in ("", node) and seen[n][2]
                    for n in replaced)  # fmt: skip
        return seen if moved else None

    wait_for(elsewhere, LOSS_TIMEOUT, "the replaced pods to run on another node", interval=1,
             show=lambda: (where(kubectl, namespace), events(kubectl, namespace, "recover")))  # fmt: skip
    print(f"{node} tainted unreachable {taint_after:.0f}s after it stopped; its pods replaced and Ready on "
          f"another node {time.monotonic() - stopped:.0f}s after it stopped")  # fmt: skip

    # The recovered dispatcher runs on a new claim, and the Event says that the running jobs were lost.
    new_claim = kubectl.get("pvc", "journal-recover-dispatcher-0", "-n", namespace)
    assert new_claim is not None and new_claim["metadata"]["uid"] != claim["metadata"]["uid"], new_claim
    said = events(kubectl, namespace, "recover")
    lost = [m for t, r, m in said if (t, r) == ("Warning", "JournalLost")]
    assert len(lost) == 1 and "the jobs that were running are lost, and clients must start new ones" in lost[0], said
    assert [r for _, r, _ in said].count("ReplacedLostPod") == 1, said
    wait_for(lambda: condition(kubectl, namespace, "recover").get("status") == "True", 60, "recover to be Ready",
             show=lambda: condition(kubectl, namespace, "recover"))  # fmt: skip

    # Wait: the dispatcher stays where it was, and the status and one Warning Event say what a person can do.
    wait_for(lambda: condition(kubectl, namespace, "waiting").get("reason") == "DispatcherNodeLost", 30,
             "waiting's Ready to say the dispatcher's node is lost",
             show=lambda: condition(kubectl, namespace, "waiting"))  # fmt: skip
    kept = before["waiting-dispatcher-0"][:2]  # the same pod, on the same node
    holds_for(lambda: where(kubectl, namespace).get("waiting-dispatcher-0"), HOLD_SECONDS,
              "the waiting dispatcher pod", lambda seen: seen is not None and seen[:2] == kept)  # fmt: skip
    message = condition(kubectl, namespace, "waiting")["message"]
    assert "kubectl delete pod waiting-dispatcher-0 --force --grace-period=0" in message, message
    warned = [m for t, r, m in events(kubectl, namespace, "waiting") if (t, r) == ("Warning", "DispatcherNodeLost")]
    assert len(warned) == 1, events(kubectl, namespace, "waiting")

    # What the person does: the pod comes back on the other node, and the service is Ready again.
    kubectl.run("delete", "pod", "waiting-dispatcher-0", "-n", namespace, "--force", "--grace-period=0")
    wait_for(lambda: condition(kubectl, namespace, "waiting").get("status") == "True", 60, "waiting to be Ready",
             show=lambda: (condition(kubectl, namespace, "waiting"), where(kubectl, namespace)))  # fmt: skip
    assert where(kubectl, namespace)["waiting-dispatcher-0"][1] in elsewhere_nodes, where(kubectl, namespace)
    assert json.dumps(operator.errors()) == "[]"
