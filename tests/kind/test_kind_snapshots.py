"""A TFDataSnapshot on kind: workers on two nodes write a snapshot to storage every node sees, a
worker is deleted mid-save, a trainer pod loads every element once, the deletion is safe, and the
dispatcher restarted after it writes a snapshot saved then (issue 42: it never started one).

The storage is kind/cluster.sh's shared directory (mounted in every node at SHARED_MOUNT) as a
ReadWriteMany hostPath PersistentVolume: what an NFS or cloud file store volume is on a real
cluster. The service mounts it at /snapshots in its dispatcher and workers (spec.snapshots.volume),
the trainer pods at the same path; they take the service's settings with envFrom.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from kindpods import logs, shared_claim, snapshot_trainer, tfdata_service, wait_ready
from kindpods import snapshot_status as status

from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, wait_for

pytestmark = pytest.mark.kind

SERVICE = "snapper"
ELEMENTS = 300
# Per element, on the workers: 300 elements over 2 workers take about 15 s.
SLEEP_US = 100_000


@pytest.fixture(scope="module")
def claim(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A ReadWriteMany claim bound to a hostPath volume on the directory every node mounts."""
    name = f"shared-{namespace}"
    yield shared_claim(kubectl, namespace, name)
    kubectl.run("delete", "pv", name, "--wait=false", check=False)


def trainer(kubectl: Kubectl, namespace: str, pod: str, *args: str, node: str | None = None) -> str:
    return snapshot_trainer(kubectl, namespace, pod, SERVICE, *args, node=node)


def test_a_snapshot_written_across_nodes_survives_a_lost_worker_loads_once_and_deletes_safely(
    kubectl: Kubectl, namespace: str, claim: str
) -> None:
    service = tfdata_service(SERVICE)
    service["metadata"]["namespace"] = namespace
    service["spec"]["snapshots"] = {"directory": "/snapshots", "volume": {"claimName": claim}}
    kubectl.apply(service)
    wait_ready(kubectl, namespace, SERVICE)
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={SERVICE}")["items"]
    nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    print(f"placed: {nodes}")

    name = f"{namespace}-squares"  # the shared directory is every namespace's: a name of its own
    kubectl.apply({"apiVersion": API_VERSION, "kind": "TFDataSnapshot",
                   "metadata": {"name": "squares", "namespace": namespace},
                   "spec": {"service": SERVICE, "snapshotName": name, "deletionPolicy": "Delete"}})  # fmt: skip
    wait_for(lambda: status(kubectl, namespace, "squares"), 60, "the snapshot waiting for a trainer",
             until=lambda s: s.get("reason") == "WaitingForSave")  # fmt: skip

    saved = trainer(kubectl, namespace, "save", "save", name, SERVICE, f"--elements={ELEMENTS}",
                    f"--sleep-us={SLEEP_US}")  # fmt: skip
    assert f"saved /snapshots/{name}" in saved, saved
    wait_for(lambda: status(kubectl, namespace, "squares"), 60, "IN_PROGRESS",
             until=lambda s: s.get("state") == "IN_PROGRESS")  # fmt: skip
    lost = kubectl.json("get", "pod", f"{SERVICE}-worker-1", "-n", namespace)["metadata"]["uid"]
    kubectl.run("delete", "pod", f"{SERVICE}-worker-1", "-n", namespace, "--wait=false")
    done = wait_for(lambda: status(kubectl, namespace, "squares"), 300, "the snapshot to end",
                    until=lambda s: s.get("state") in ("COMPLETED", "FAILED", "ABANDONED"))  # fmt: skip
    assert done["state"] == "COMPLETED" and done["elements"] == ELEMENTS and done["streams"] == "2/2", done
    replaced = kubectl.json("get", "pod", f"{SERVICE}-worker-1", "-n", namespace)["metadata"]["uid"]
    assert replaced != lost

    # A trainer on a node where worker-0 did not write loads every element once.
    listed = kubectl.json("get", "nodes")["items"]
    away = next(n["metadata"]["name"] for n in listed if n["metadata"]["name"] != nodes[f"{SERVICE}-worker-0"])
    loaded = trainer(kubectl, namespace, "load", "load", name, SERVICE, node=away)
    counts = Counter(line.split(" ", 1)[1] for line in loaded.splitlines() if line.startswith("element "))
    expected = {f"{i},{i * i + 7}" for i in range(ELEMENTS)}
    assert set(counts) == expected and set(counts.values()) == {1}, loaded[-2000:]

    # Deleted with its data; the dispatcher, whose journal names the path, comes back Ready.
    kubectl.run("delete", "tfsnap", "squares", "-n", namespace, "--timeout=90s", timeout=100)
    dispatcher = kubectl.json("get", "pod", f"{SERVICE}-dispatcher-0", "-n", namespace)["metadata"]["uid"]
    kubectl.run("delete", "pod", f"{SERVICE}-dispatcher-0", "-n", namespace)
    wait_for(lambda: kubectl.json("get", "pod", f"{SERVICE}-dispatcher-0", "-n", namespace)["metadata"]["uid"],
             120, "the dispatcher replaced", until=lambda uid: uid != dispatcher)  # fmt: skip
    wait_ready(kubectl, namespace, SERVICE)
    # It replayed its journal without failing once, the deleted snapshot dropped from it first.
    restarted = kubectl.json("get", "pod", f"{SERVICE}-dispatcher-0", "-n", namespace)["status"]["containerStatuses"]
    said = logs(kubectl, namespace, f"{SERVICE}-dispatcher-0")
    assert all(c["restartCount"] == 0 for c in restarted), (restarted, said)
    assert f"the journal no longer names the snapshot at /snapshots/{name}" in said, said[-3000:]
    # A snapshot saved after the restart is written by the workers that ran through it, and loads.
    after = f"{namespace}-after-restart"
    saved = trainer(kubectl, namespace, "save-after", "save", after, SERVICE, "--elements=20")
    assert f"saved /snapshots/{after}" in saved, saved
    loaded = trainer(kubectl, namespace, "load-after", "load", after, SERVICE, "--timeout=90")
    assert "loaded 20" in loaded, loaded[-2000:]
