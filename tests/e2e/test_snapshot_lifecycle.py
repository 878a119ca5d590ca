"""A TFDataSnapshot end to end: real dispatcher and worker pods write a tf.data distributed snapshot
that a real trainer started, the operator follows it, and a trainer loads it back.

One service (DYNAMIC, 2 workers) with ``spec.snapshots.directory`` on the dev node's disk, which
every pod and the trainer (a process in the node's client network namespace, with the service's
published settings in its environment) see at the same path. In one run, as a user would:

1. a TFDataSnapshot (deletionPolicy Delete) waits for a trainer (TRIGGER_PENDING);
2. the trainer saves a dataset slow enough to take a while; the snapshot is IN_PROGRESS;
3. a worker pod is deleted mid-save: it comes back at the same address and finishes its stream;
4. a scale-down asked for mid-save waits, naming the snapshot, and is carried out once it completes;
5. the snapshot COMPLETES with every element; a trainer loads each element exactly once, with the
   values the pipeline computes in process;
6. the TFDataSnapshot is deleted: the dispatcher deletes the data (its chunks are gone from disk),
   then the dispatcher pod is deleted and comes back Ready on its journal, and writes a snapshot
   saved after it to the end.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tfdata_operator.plan import hold
from tfdata_operator.wire import snapshots as snapshotwire

from devcluster import node as nodeagent
from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, KubectlError, OperatorProcess, holds_for, wait_for

CLIENT = Path(__file__).resolve().parent / "clients" / "snapshot_dataset.py"
SERVICE = "snapper"
SNAPSHOT = "squares"
ELEMENTS = 400
# Per element, on the workers: 400 elements over 2 workers take about 20 s.
SLEEP_US = 100_000
TIMEOUT = 240
# A hold is sampled over more than one of the operator's rechecks.
HOLD = hold.SNAPSHOT_RECHECK_SECONDS * 1.5


@pytest.fixture(scope="module")
def snapshot_dir(node_disk: Path) -> Path:
    """Where the pods and the trainer see the snapshots."""
    return node_disk


def client_settings(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """What ``envFrom`` of the <service>-client ConfigMap gives a trainer pod."""
    return dict(kubectl.json("get", "configmap", f"{SERVICE}-client", "-n", namespace)["data"])


def trainer(
    state_dir: Path, kubectl: Kubectl, namespace: str, *args: str, name: str = SNAPSHOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    with nodeagent.client_netns(state_dir, namespace) as prefix:
        env = nodeagent.client_env() | client_settings(kubectl, namespace)
        return subprocess.run(
            [*prefix, "python", str(CLIENT), args[0], name, SERVICE, *args[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def snapshot_status(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    return (kubectl.get("tfdatasnapshot", SNAPSHOT, "-n", namespace) or {}).get("status") or {}


def events(kubectl: Kubectl, namespace: str, kind: str, name: str) -> list[tuple[str, str]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    listed = kubectl.json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return [(e["type"], e["reason"]) for e in listed]


def test_a_snapshot_is_saved_followed_loaded_exactly_once_and_deleted_safely(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path, snapshot_dir: Path
) -> None:
    kubectl.apply({
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "metadata": {"name": SERVICE, "namespace": namespace},
        "spec": {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 2},
                 "snapshots": {"directory": str(snapshot_dir)}},
    })  # fmt: skip
    waited = kubectl.run("wait", "--for=condition=Ready", f"tfdata/{SERVICE}", "-n", namespace, "--timeout=300s",
                         check=False, timeout=310)  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    kubectl.apply({
        "apiVersion": API_VERSION,
        "kind": "TFDataSnapshot",
        "metadata": {"name": SNAPSHOT, "namespace": namespace},
        "spec": {"service": SERVICE, "deletionPolicy": "Delete"},
    })  # fmt: skip
    wait_for(lambda: snapshot_status(kubectl, namespace), 60, "the snapshot to wait for a trainer",
             until=lambda s: s.get("reason") == "WaitingForSave", show=operator.tail)  # fmt: skip

    # 2. The trainer saves; the workers write.
    started = time.monotonic()
    saved = trainer(node_state_dir, kubectl, namespace, "save", f"--elements={ELEMENTS}", f"--sleep-us={SLEEP_US}")
    assert saved.returncode == 0 and f"saved {snapshot_dir / SNAPSHOT}" in saved.stdout, saved
    wait_for(lambda: snapshot_status(kubectl, namespace), 60, "IN_PROGRESS",
             until=lambda s: s.get("state") == "IN_PROGRESS", show=operator.tail)  # fmt: skip

    # 3. A worker lost mid-save comes back at the same address and goes on with its stream.
    worker = kubectl.json("get", "pod", f"{SERVICE}-worker-1", "-n", namespace)
    kubectl.run("delete", "pod", f"{SERVICE}-worker-1", "-n", namespace, "--wait=false")

    # 4. A scale-down asked for mid-save waits for the snapshot.
    kubectl.run("scale", "tfdata", SERVICE, "-n", namespace, "--replicas=1")
    held = wait_for(lambda: (kubectl.get("tfdata", SERVICE, "-n", namespace).get("status") or {}).get("held") or {},
                    60, "the scale-down held", until=lambda h: "snapshot" in h.get("message", ""))  # fmt: skip
    assert str(snapshot_dir / SNAPSHOT) in held["message"], held

    # Every uid worker-1 was seen with: its replacement may come, finish its stream, and (the snapshot
    # complete) go with the scale-down between two looks, so each look counts.
    worker_uids: set[str] = set()

    def look_at_worker_1() -> set[str]:
        # Not there now (KubectlError): deleted, not yet made again, or scaled away after the snapshot completed.
        with contextlib.suppress(KubectlError):
            worker_uids.add(kubectl.json("get", "pod", f"{SERVICE}-worker-1", "-n", namespace)["metadata"]["uid"])
        return worker_uids - {worker["metadata"]["uid"]}

    def on_disk() -> dict[str, Any]:
        """The workers the operator keeps, and the snapshot's state as its files say it now."""
        names = [p.name for p in (snapshot_dir / SNAPSHOT).iterdir()] if (snapshot_dir / SNAPSHOT).is_dir() else []
        workers = kubectl.json("get", "statefulset", f"{SERVICE}-worker", "-n", namespace)["spec"]["replicas"]
        look_at_worker_1()
        return {"workers": workers, "files say": snapshotwire.state_from_names(names)}

    # Held across more than one recheck, not only at the first: no worker goes while the files say
    # the snapshot is being written (it may complete meanwhile, and the scale-down then goes).
    holds_for(on_disk, HOLD, "the scale-down held while the snapshot is written",
              ok=lambda seen: seen["workers"] == 2 or seen["files say"] != snapshotwire.IN_PROGRESS)  # fmt: skip
    wait_for(look_at_worker_1, 90, "worker-1 replaced (seen with a new uid)",
             show=lambda: f"worker-1 seen with {sorted(worker_uids)}, deleted {worker['metadata']['uid']}")  # fmt: skip

    # 5. It completes with every element, and the held scale-down is carried out.
    done = wait_for(lambda: snapshot_status(kubectl, namespace), TIMEOUT, "COMPLETED",
                    until=lambda s: s.get("state") in ("COMPLETED", "FAILED", "ABANDONED"),
                    show=lambda: (snapshot_status(kubectl, namespace), operator.tail()))  # fmt: skip
    took = time.monotonic() - started
    assert done["state"] == "COMPLETED", done
    assert done["elements"] == ELEMENTS and done["streams"] == "2/2", done
    print(f"snapshot of {ELEMENTS} elements completed {took:.0f}s after the save, a worker lost on the way")
    said = events(kubectl, namespace, "TFDataSnapshot", SNAPSHOT)
    assert ("Normal", "SnapshotStarted") in said and ("Normal", "SnapshotCompleted") in said, said
    wait_for(lambda: kubectl.json("get", "statefulset", f"{SERVICE}-worker", "-n", namespace)["spec"]["replicas"],
             60, "the held scale-down carried out", until=lambda n: n == 1)  # fmt: skip

    loaded = trainer(node_state_dir, kubectl, namespace, "load")
    assert loaded.returncode == 0, loaded
    elements = [line.split(" ", 1)[1] for line in loaded.stdout.splitlines() if line.startswith("element ")]
    counts = Counter(elements)
    expected = {f"{i},{i * i + 7}" for i in range(ELEMENTS)}
    assert set(counts) == expected and set(counts.values()) == {1}, (len(elements), len(counts))

    # 6. Deleted with its data; the dispatcher, whose journal names it, still starts.
    kubectl.run("delete", "tfsnap", SNAPSHOT, "-n", namespace, "--timeout=90s", timeout=100)
    assert ("Normal", "DataDeleted") in events(kubectl, namespace, "TFDataSnapshot", SNAPSHOT)
    assert not (snapshot_dir / SNAPSHOT / "chunks").exists(), sorted(
        p.name for p in (snapshot_dir / SNAPSHOT).iterdir()
    )
    dispatcher = kubectl.json("get", "pod", f"{SERVICE}-dispatcher-0", "-n", namespace)
    kubectl.run("delete", "pod", f"{SERVICE}-dispatcher-0", "-n", namespace, "--wait=false")
    wait_for(lambda: kubectl.json("get", "pod", f"{SERVICE}-dispatcher-0", "-n", namespace)["metadata"]["uid"],
             90, "the dispatcher replaced", until=lambda uid: uid != dispatcher["metadata"]["uid"])  # fmt: skip
    ready = kubectl.run("wait", "--for=condition=Ready", f"tfdata/{SERVICE}", "-n", namespace, "--timeout=180s",
                        check=False, timeout=190)  # fmt: skip
    assert ready.returncode == 0, (ready.stderr, json.dumps(kubectl.get("tfdata", SERVICE, "-n", namespace)["status"]))
    # The dispatcher back on its journal takes and finishes a new snapshot: the finished one left
    # its journal before it started (TensorFlow would hand it to the workers on every heartbeat in
    # place of the new one, whose streams never started: issue 42).
    again = trainer(node_state_dir, kubectl, namespace, "save", "--elements=20", name="after-restart")
    assert again.returncode == 0, again
    after = trainer(node_state_dir, kubectl, namespace, "load", "--timeout=90", name="after-restart", timeout=120)
    assert after.returncode == 0 and "loaded 20" in after.stdout, after
