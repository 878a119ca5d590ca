"""Trainers that attack their own service's dispatcher: a real dispatcher of service B (real
TensorFlow server pods) beside service A, each with its snapshot directory on the node's disk, as a
shared snapshot volume would be.

A trainer of B reaches B's health port (anyone admitted to the service does: nothing there is
authenticated) and can write in B's snapshot directory (it mounts the volume to save). It asks B's
dispatcher to delete A's completed snapshot, plants a finished snapshot whose ``chunks`` links into
A's, one whose ``ERROR`` links to a secret file (and names it in a TFDataSnapshot, so the operator
reads it too), and floods B's health port with connections that never end. A's files all stay, the
secret is in no answer and no status, and B stays Ready throughout.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devcluster import node as nodeagent
from fixtures.hostile import (
    FLOOD_CONNECTIONS,
    FLOOD_SECONDS,
    Flood,
    attack_snapshots,
    check_attack,
    files,
    pod_ready,
    ready_condition,
)
from fixtures.manifests import API_VERSION, service_manifest
from fixtures.support import ROOT, Kubectl, OperatorProcess, holds_for, wait_for

CLIENT = ROOT / "tests" / "e2e" / "clients" / "snapshot_dataset.py"
SECRET = "TFDATA_TOKEN=kept-from-trainers-hostile-7e2a"
HEALTH_PORT = 8080


@pytest.fixture(scope="module")
def snapshot_root(node_disk: Path) -> Path:
    """A's and B's snapshot directories, where the pods and the trainer see them."""
    (node_disk / "a").mkdir()
    (node_disk / "b").mkdir()
    return node_disk


def service(name: str, directory: Path) -> dict[str, Any]:
    return service_manifest(
        name, {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 1}, "snapshots": {"directory": str(directory)}}
    )


def tfsnapshot(name: str, svc: str, snapshot_name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "TFDataSnapshot",
        "metadata": {"name": name},
        "spec": {"service": svc, "snapshotName": snapshot_name, "deletionPolicy": "Retain"},
    }


def trainer(state_dir: Path, kubectl: Kubectl, namespace: str, svc: str, *args: str) -> str:
    settings = dict(kubectl.json("get", "configmap", f"{svc}-client", "-n", namespace)["data"])
    with nodeagent.client_netns(state_dir, namespace) as prefix:
        done = subprocess.run(
            [*prefix, "python", str(CLIENT), args[0], args[1], svc, *args[2:]],
            env=nodeagent.client_env() | settings, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done
    return done.stdout


def test_a_trainer_of_b_cannot_delete_a_s_data_nor_read_a_secret_nor_stall_b(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path, snapshot_root: Path
) -> None:
    a_dir, b_dir = snapshot_root / "a", snapshot_root / "b"
    kubectl.apply(service("a", a_dir), "-n", namespace)
    kubectl.apply(service("b", b_dir), "-n", namespace)
    for name in ("a", "b"):
        waited = kubectl.run("wait", "--for=condition=Ready", f"tfdata/{name}", "-n", namespace, "--timeout=180s",
                             check=False, timeout=190)  # fmt: skip
        assert waited.returncode == 0, (name, waited.stderr, ready_condition(kubectl, namespace, name))

    # A's completed snapshot, followed by a TFDataSnapshot.
    kubectl.apply(tfsnapshot("a-train", "a", "train"), "-n", namespace)
    assert f"saved {a_dir / 'train'}" in trainer(node_state_dir, kubectl, namespace, "a", "save", "train",
                                                 "--elements=40")  # fmt: skip
    wait_for(lambda: (kubectl.get("tfsnap", "a-train", "-n", namespace) or {}).get("status") or {}, 90,
             "A's snapshot COMPLETED", until=lambda s: s.get("state") == "COMPLETED", show=operator.tail)  # fmt: skip
    a_files = files(a_dir)
    assert "train/DONE" in a_files and any(p.startswith("train/chunks/") for p in a_files), sorted(a_files)

    pod = kubectl.json("get", "pod", "b-dispatcher-0", "-n", namespace)
    # 1.-3. DELETEs outside B's directory (A's snapshot by its path, through "..", A's directory), a
    # finished snapshot planted in B's whose chunks are A's, one whose ERROR links to a secret file.
    secret = snapshot_root / "secret-env"
    secret.write_text(SECRET + "\n")
    base = f"http://{pod['status']['podIP']}:{HEALTH_PORT}"
    seen = attack_snapshots(base, str(a_dir), str(b_dir), "train", str(secret))
    check_attack(seen, SECRET)
    assert files(a_dir) == a_files
    leak = b_dir / "leak"
    kubectl.apply(tfsnapshot("b-leak", "b", "leak"), "-n", namespace)
    read = wait_for(lambda: (kubectl.get("tfsnap", "b-leak", "-n", namespace) or {}).get("status") or {}, 60,
                    "the operator to read the planted snapshot (the dispatcher's answer names the link)",
                    until=lambda s: "symbolic link" in s.get("message", ""), show=operator.tail)  # fmt: skip
    print(f"the planted ERROR link, as the operator reports it: {json.dumps(read)}")

    # 4. B's health port flooded with connections that never end: B stays Ready, sampled.
    flood = Flood(pod["status"]["podIP"], HEALTH_PORT, FLOOD_CONNECTIONS).start()
    try:
        wait_for(lambda: flood.opened, 30, f"{FLOOD_CONNECTIONS} connections open",
                 until=lambda n: n >= FLOOD_CONNECTIONS)  # fmt: skip
        samples = holds_for(
            lambda: (ready_condition(kubectl, namespace, "b"), pod_ready(kubectl, namespace, "b-dispatcher-0")),
            FLOOD_SECONDS,
            "B Ready while its health port is flooded",
            ok=lambda seen: seen[0].startswith("True ") and seen[1],
            interval=0.5,
        )
        opened = flood.opened
    finally:
        flood.stop()
    print(f"B stayed Ready over {samples} samples in {FLOOD_SECONDS:.0f}s; the flood opened {opened} connections")
    assert opened > FLOOD_CONNECTIONS, "the server closed none of the flood's connections: the cap was never met"

    # Nothing of A went, and the secret is nowhere the operator wrote.
    assert files(a_dir) == a_files
    seen = json.dumps([o.get("status") for o in kubectl.json("get", "tfsnap,tfdata", "-n", namespace)["items"]])
    events = json.dumps([e.get("message") for e in kubectl.json("get", "events", "-n", namespace)["items"]])
    assert SECRET not in seen and SECRET not in events
    assert secret.read_text() == SECRET + "\n" and (leak / "ERROR").is_symlink()
    for name in ("b-leak", "a-train"):
        kubectl.run("delete", "tfsnap", name, "-n", namespace, "--timeout=60s", timeout=70)
