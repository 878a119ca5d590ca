"""A node that stops answering, and the operator replacing its pods without a human (spec.nodeLoss):
only what holds no state on a guess, everything at once on certainty, and never a journal deleted.

A second kwok node joins the cluster for this module; three services place their pods there (a
required node affinity for a label that only that node carries at first; once the pods run there, the
other kwok nodes get the label too, so the replacements have somewhere to go). Then kwok stops
managing it (``stop``), so nothing renews its Lease or posts its status: the real node lifecycle
controller marks it Unknown after its --node-monitor-grace-period (50 s by default in v1.34, which the
dev cluster keeps), taints it node.kubernetes.io/unreachable and marks its pods not Ready, as it would
for a machine that lost power, or for one that is only slow. That is a guess, so

- every worker is replaced after replaceAfterSeconds (30, the least): a worker keeps no state;
- ``guess`` (Recover, its journal on a kwok hostPath volume, which only that node reaches): its
  dispatcher stays until dispatcherReplaceAfterSeconds (60 here; 300 by default), then its volume is
  set to Retain, its claim let go (kwok would delete a Released volume of reclaim Delete), and it comes
  back on a new claim; a Warning Event names the volume that keeps the old journal;
- ``shared`` (Recover, its journal at a gs:// URL, which other nodes reach) and ``waiting``
  (dispatcher: Wait): their dispatchers stay, and the status and a Warning Event say what a person can do.

Then the test does what that person does: it taints the node node.kubernetes.io/out-of-service, and both
dispatchers come back on another node within seconds (``waiting``'s volume kept too). The taint's effect
here is NoSchedule: the checks of Kubernetes' non-graceful node shutdown key on the taint alone, and
NoExecute would also have the taint manager evict the pods, and the pod garbage collector force-delete
them in its next 20 s round, racing the operator; the test is about what the operator does.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import devcluster
from fixtures.manifests import service_manifest
from fixtures.support import Kubectl, OperatorProcess, holds_for, kubelet_nodes, wait_for

# Cluster-wide, so a name of its own for sessions sharing a cluster.
NODE = f"lost-{secrets.token_hex(3)}"
# The label the pods require: on NODE from the start, on the other kwok nodes once the pods run on NODE.
# A preferred affinity for NODE alone lost to the scheduler's other scores (spreading, free resources)
# now and then, and a pod started on the node that is not lost.
PLACE = f"test.tfdata.dev/{NODE}"
# The node lifecycle controller's grace period (50 s), its 5 s period, the tainter's rate limit, and the
# replacements on a loaded 2-core machine.
LOSS_TIMEOUT = 180
REPLACE_AFTER = 30  # the least
DISPATCHER_AFTER = 60
HOLD_SECONDS = 6.0
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


def placed_there(replicas: int | None = None) -> dict[str, Any]:
    """Pod settings that run on kwok's nodes that carry PLACE: at first only the node this module loses."""
    required = {"nodeSelectorTerms": [{"matchExpressions": [{"key": PLACE, "operator": "Exists"}]}]}
    pod: dict[str, Any] = {
        "tolerations": [devcluster.KWOK_TOLERATION],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
    }
    return pod if replicas is None else {**pod, "replicas": replicas}


def service(name: str, namespace: str, journal: dict[str, Any] | None = None, **node_loss: Any) -> dict[str, Any]:
    loss = {"replaceAfterSeconds": REPLACE_AFTER, "dispatcherReplaceAfterSeconds": DISPATCHER_AFTER, **node_loss}
    return service_manifest(
        name,
        {
            "shardingPolicy": "DYNAMIC",
            "nodeLoss": loss,
            "dispatcher": {**placed_there(), **(journal or {})},
            "workers": placed_there(replicas=1),
        },
        namespace,
    )


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


def taint_added(kubectl: Kubectl, node: str, key: str) -> datetime | None:
    taints = (kubectl.get("node", node).get("spec") or {}).get("taints") or []
    added = [t.get("timeAdded") for t in taints if t["key"] == key]
    return datetime.strptime(added[0], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) if added else None


def volume(kubectl: Kubectl, name: str) -> dict[str, Any] | None:
    found = kubectl.run("get", "pv", name, "-o", "json", "--ignore-not-found").stdout.strip()
    return json.loads(found) if found else None


SERVICES = {
    "guess": {},
    "shared": {"journal": {"workDir": "gs://tfdata-test-bucket/journal", "storage": {"enabled": False}}},
    "waiting": {"dispatcher": "Wait"},
}


def test_a_guess_replaces_only_what_holds_no_state_and_certainty_the_rest_at_once(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node: str
) -> None:
    for name, setting in SERVICES.items():
        kubectl.apply(service(name, namespace, **setting))
    names = {f"{s}-{part}-0" for s in SERVICES for part in ("dispatcher", "worker")}
    before = wait_for(
        lambda: (
            (seen := where(kubectl, namespace)).keys() >= names
            and all(seen[n][1:] == (node, True) for n in names)
            and seen
        ),
        90,
        f"the six pods to run on {node}",
        show=lambda: where(kubectl, namespace),
    )
    claims = {s: kubectl.get("pvc", f"journal-{s}-dispatcher-0", "-n", namespace) for s in ("guess", "waiting")}
    assert all(c is not None and c["status"]["phase"] == "Bound" for c in claims.values()), claims
    elsewhere_nodes = others(kubectl, node)
    assert elsewhere_nodes, "the dev cluster has no other kwok node for the replacements"
    kubectl.run("label", "nodes", *elsewhere_nodes, f"{PLACE}=elsewhere")
    retained: list[str] = []
    try:
        _lose_the_node(kubectl, namespace, operator, node, before, claims, elsewhere_nodes, retained)
    finally:
        for pv in retained:  # kept by design: nothing else deletes a volume of reclaim Retain
            kubectl.run("delete", "pv", pv, "--ignore-not-found", "--wait=false")


def _lose_the_node(
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    node: str,
    before: dict[str, tuple[str, str, bool]],
    claims: dict[str, Any],
    elsewhere_nodes: list[str],
    retained: list[str],
) -> None:
    # The node stops answering: nothing renews its Lease or posts its status any more.
    stop(kubectl, node)
    stopped = time.monotonic()
    tainted = wait_for(lambda: taint_added(kubectl, node, "node.kubernetes.io/unreachable"), LOSS_TIMEOUT,
                       f"{node} to be tainted unreachable", interval=1,
                       show=lambda: kubectl.get("node", node).get("status", {}).get("conditions"))  # fmt: skip
    print(f"{node} tainted unreachable {time.monotonic() - stopped:.0f}s after it stopped")

    def moved(*pods: str) -> Callable[[], dict[str, tuple[str, str, bool]] | None]:
        def probe() -> dict[str, tuple[str, str, bool]] | None:
            seen = where(kubectl, namespace)
            gone = all(n in seen and seen[n][0] != before[n][0] and seen[n][1] not in ("", node) and seen[n][2]
                       for n in pods)  # fmt: skip
            return seen if gone else None

        return probe

    # A guess: the workers, which keep no state, go after replaceAfterSeconds; no dispatcher does.
    workers = [f"{s}-worker-0" for s in SERVICES]
    wait_for(moved(*workers), LOSS_TIMEOUT, "the workers to run on another node", interval=1,
             show=lambda: (where(kubectl, namespace), events(kubectl, namespace, "guess")))  # fmt: skip
    lag = (datetime.now(timezone.utc) - tainted).total_seconds()
    print(f"the workers replaced and Ready on another node {lag:.0f}s after the unreachable taint "
          f"(replaceAfterSeconds {REPLACE_AFTER})")  # fmt: skip
    assert lag >= REPLACE_AFTER - 1, lag
    dispatchers = {f"{s}-dispatcher-0": before[f"{s}-dispatcher-0"][:2] for s in SERVICES}
    left = (tainted + timedelta(seconds=DISPATCHER_AFTER) - datetime.now(timezone.utc)).total_seconds() - 5
    holds_for(lambda: {n: where(kubectl, namespace).get(n, ("",))[:2] for n in dispatchers}, max(1.0, left),
              "every dispatcher pod where it was, until dispatcherReplaceAfterSeconds",
              lambda seen: seen == dispatchers)  # fmt: skip

    # guess: after dispatcherReplaceAfterSeconds, its node-local journal is kept (Retain) and it moves.
    wait_for(moved("guess-dispatcher-0"), LOSS_TIMEOUT, "guess's dispatcher to run on another node", interval=1,
             show=lambda: (where(kubectl, namespace), events(kubectl, namespace, "guess")))  # fmt: skip
    lag = (datetime.now(timezone.utc) - tainted).total_seconds()
    print(f"guess's dispatcher replaced and Ready on another node {lag:.0f}s after the unreachable taint "
          f"(dispatcherReplaceAfterSeconds {DISPATCHER_AFTER})")  # fmt: skip
    old_pv = claims["guess"]["spec"]["volumeName"]
    retained.append(old_pv)
    new_claim = kubectl.get("pvc", "journal-guess-dispatcher-0", "-n", namespace)
    assert new_claim is not None and new_claim["metadata"]["uid"] != claims["guess"]["metadata"]["uid"], new_claim
    kept = holds_for(lambda: volume(kubectl, old_pv), HOLD_SECONDS, f"the old journal's volume {old_pv}",
                     lambda pv: pv is not None and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
                     and pv["status"]["phase"] == "Released")  # fmt: skip
    assert kept > 1
    said = events(kubectl, namespace, "guess")
    lost = [m for t, r, m in said if (t, r) == ("Warning", "JournalLost")]
    assert len(lost) == 1 and f"the volume {old_pv} (" in lost[0] and "the old journal is kept there" in lost[0], said
    assert "(a guess: a node that is only slow looks the same)" in lost[0], lost
    wait_for(lambda: condition(kubectl, namespace, "guess").get("status") == "True", 60, "guess to be Ready",
             show=lambda: condition(kubectl, namespace, "guess"))  # fmt: skip

    # shared and waiting: their dispatchers stay, and the status and one Warning Event say why and what to do.
    for name, why in (("shared", "nothing says the node is fenced"), ("waiting", "spec.nodeLoss.dispatcher is Wait")):
        message = condition(kubectl, namespace, name).get("message", "")
        assert condition(kubectl, namespace, name).get("reason") == "DispatcherNodeLost" and why in message, message
        assert f"kubectl taint node {node} {OUT_OF_SERVICE}=nodeshutdown:NoExecute" in message, message
        warned = [m for t, r, m in events(kubectl, namespace, name) if (t, r) == ("Warning", "DispatcherNodeLost")]
        assert len(warned) == 1, events(kubectl, namespace, name)
    rest = {n: dispatchers[n] for n in ("shared-dispatcher-0", "waiting-dispatcher-0")}
    holds_for(lambda: {n: where(kubectl, namespace).get(n, ("",))[:2] for n in rest}, HOLD_SECONDS,
              "the shared and waiting dispatcher pods where they were", lambda seen: seen == rest)  # fmt: skip

    # What a person (or a fencing agent) does once the node is known to be off: both go at once.
    kubectl.run("taint", "node", node, f"{OUT_OF_SERVICE}=nodeshutdown:NoSchedule")
    marked = time.monotonic()
    wait_for(moved("shared-dispatcher-0", "waiting-dispatcher-0"), 60,
             "the shared and waiting dispatchers to run on another node", interval=0.5,
             show=lambda: (where(kubectl, namespace), events(kubectl, namespace, "waiting")))  # fmt: skip
    print(
        f"out-of-service taint to both dispatchers replaced and Ready on another node: {time.monotonic() - marked:.1f}s"
    )
    old_pv = claims["waiting"]["spec"]["volumeName"]
    retained.append(old_pv)
    pv = volume(kubectl, old_pv)
    assert pv is not None and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain", pv
    for name, reason in (("shared", "ReplacedLostPod"), ("waiting", "JournalLost")):
        said = [m for _, r, m in events(kubectl, namespace, name) if r == reason and "the dispatcher pod" in m]
        assert len(said) == 1 and f"is known to be off: it is tainted {OUT_OF_SERVICE}" in said[0], said
        wait_for(lambda n=name: condition(kubectl, namespace, n).get("status") == "True", 60, f"{name} to be Ready",
                 show=lambda n=name: condition(kubectl, namespace, n))  # fmt: skip
    assert where(kubectl, namespace)["waiting-dispatcher-0"][1] in elsewhere_nodes, where(kubectl, namespace)
    assert json.dumps(operator.errors()) == "[]"
