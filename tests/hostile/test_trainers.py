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
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, Kubectl, OperatorProcess, holds_for, wait_for

from devcluster import node as nodeagent

CLIENT = ROOT / "tests" / "e2e" / "clients" / "snapshot_dataset.py"
SECRET = "TFDATA_TOKEN=kept-from-trainers-hostile-7e2a"
HEALTH_PORT = 8080
# More than the health port's connection cap (server/health.py MAX_CONNECTIONS, 512).
FLOOD_CONNECTIONS = 600
FLOOD_SECONDS = 20.0


@pytest.fixture(scope="module")
def snapshot_root(node_disk: Path) -> Path:
    """A's and B's snapshot directories, where the pods and the trainer see them."""
    (node_disk / "a").mkdir()
    (node_disk / "b").mkdir()
    return node_disk


def service(name: str, directory: Path) -> dict[str, Any]:
    return {
        "apiVersion": "tfdata.dev/v1alpha1",
        "kind": "TFDataService",
        "metadata": {"name": name},
        "spec": {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 1}, "snapshots": {"directory": str(directory)}},
    }


def tfsnapshot(name: str, svc: str, snapshot_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tfdata.dev/v1alpha1",
        "kind": "TFDataSnapshot",
        "metadata": {"name": name},
        "spec": {"service": svc, "snapshotName": snapshot_name, "deletionPolicy": "Retain"},
    }


def files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (links not followed) and its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def ask(method: str, url: str) -> tuple[int, str]:
    """What the dispatcher answers a trainer, whatever it is."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=60) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def ready(kubectl: Kubectl, namespace: str, name: str) -> str:
    status = (kubectl.get("tfdata", name, "-n", namespace) or {}).get("status") or {}
    condition = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    return f"{condition.get('status')} {condition.get('reason')}: {condition.get('message', '')}"


class Flood:
    """``count`` connections to a health port that send a request a byte a second and never finish
    it; each one the server closes is opened again at once, until ``stop``."""

    def __init__(self, host: str, port: int, count: int) -> None:
        self.address, self.count = (host, port), count
        self.stopped = threading.Event()
        self.opened = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._one, daemon=True) for _ in range(count)]

    def start(self) -> Flood:
        for thread in self.threads:
            thread.start()
        return self

    def _one(self) -> None:
        request = b"GET /readyz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
        while not self.stopped.is_set():
            try:
                with socket.create_connection(self.address, timeout=5) as sock:
                    with self.lock:
                        self.opened += 1
                    for i in range(len(request)):
                        if self.stopped.is_set():
                            return
                        sock.sendall(request[i : i + 1])
                        self.stopped.wait(1.0)
            except OSError:
                self.stopped.wait(0.1)

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(10)


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
        assert waited.returncode == 0, (name, waited.stderr, ready(kubectl, namespace, name))

    # A's completed snapshot, followed by a TFDataSnapshot.
    kubectl.apply(tfsnapshot("a-train", "a", "train"), "-n", namespace)
    assert f"saved {a_dir / 'train'}" in trainer(node_state_dir, kubectl, namespace, "a", "save", "train",
                                                 "--elements=40")  # fmt: skip
    wait_for(lambda: (kubectl.get("tfsnap", "a-train", "-n", namespace) or {}).get("status") or {}, 90,
             "A's snapshot COMPLETED", until=lambda s: s.get("state") == "COMPLETED", show=operator.tail)  # fmt: skip
    a_files = files(a_dir)
    assert "train/DONE" in a_files and any(p.startswith("train/chunks/") for p in a_files), sorted(a_files)

    pod = kubectl.json("get", "pod", "b-dispatcher-0", "-n", namespace)
    b_url = f"http://{pod['status']['podIP']}:{HEALTH_PORT}/v1/snapshots?"

    def url(path: str) -> str:
        return b_url + urllib.parse.urlencode({"path": path})

    # 1. A DELETE outside B's directory: A's snapshot by its path, and through "..".
    for path in (str(a_dir / "train"), f"{b_dir}/../a/train", str(a_dir)):
        status, body = ask("DELETE", url(path))
        assert status == 403, (path, status, body)
    assert files(a_dir) == a_files, "a DELETE through B deleted some of A's files"

    # 2. A finished snapshot planted in B's directory whose chunks are A's.
    planted = b_dir / "planted"
    planted.mkdir()
    shutil.copy(a_dir / "train" / "snapshot.metadata", planted / "snapshot.metadata")
    (planted / "DONE").write_bytes(b"")
    (planted / "chunks").symlink_to(a_dir / "train" / "chunks")
    status, body = ask("DELETE", url(str(planted)))
    assert status == 409 and "is a symbolic link" in body, (status, body)
    assert files(a_dir) == a_files, "a DELETE through a planted link deleted some of A's files"

    # 3. A snapshot whose ERROR links to a secret file, asked by the trainer and followed by the operator.
    secret = snapshot_root / "secret-env"
    secret.write_text(SECRET + "\n")
    leak = b_dir / "leak"
    leak.mkdir()
    shutil.copy(a_dir / "train" / "snapshot.metadata", leak / "snapshot.metadata")
    (leak / "ERROR").symlink_to(secret)
    status, body = ask("GET", url(str(leak)))
    assert status == 200 and SECRET not in body and "symbolic link" in body, (status, body)
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
            lambda: (ready(kubectl, namespace, "b"), pod_ready(kubectl, namespace, "b-dispatcher-0")),
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


def pod_ready(kubectl: Kubectl, namespace: str, name: str) -> bool:
    pod = kubectl.get("pod", name, "-n", namespace) or {}
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
