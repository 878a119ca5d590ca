"""Hostile tenants on kind: the dev cluster's hostile cases (tests/hostile) against the operator the
chart installed, with its real RBAC, its own container and real kubelets.

Servers: four services run the tenant image ``tfdata-hostile`` (images/hostile: its ``tfdata-server``
is tests/hostile/image/hostile_server.py) with ``serverProgram: FromImage``, whose pods answer the
operator's reads by dripping, redirecting to a "metadata" server of the test's (a pod that hands a
secret to whoever asks, and prints who did), with a huge body or a garbled one. Trainers: a trainer
pod of service B (label ``tfdata.dev/client: b``, the shared snapshot volume mounted) asks B's
dispatcher to delete A's completed snapshot, plants symlinks in B's snapshot directory, and floods
B's health port with connections that never end; the attacks are tests/fixtures/hostile.py's, the
same the dev tier makes, run in the pod.

The assertions are the dev tier's: refused or contained, none of A's files deleted, no secret and no
uncut pod text in any status or Event, the redirect never followed, B Ready throughout the flood, and
the operator's pod never restarted. The dev tier's time-to-Ready comparison (a good service beside 10
dripping ones) is not made here: docs/operations.md (Trust and tenancy) says why.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kindpods import logs, shared_claim, start_pod, wait_finished, wait_ready
from podhealth import OPERATOR_NAMESPACE, PodHealth

from tfdata_operator import __version__

from fixtures.hostile import (
    FLOOD_CONNECTIONS,
    FLOOD_SECONDS,
    METADATA_PATH,
    MODES,
    READS,
    asked_in,
    check_attack,
    check_clean,
    hostile_service,
    pod_ready,
    pod_script,
    ready_condition,
    written,
)
from fixtures.manifests import API_VERSION, service_manifest
from fixtures.support import ROOT, Kubectl, holds_for, wait_for

pytestmark = pytest.mark.kind

HOSTILE_IMAGE = f"tfdata-hostile:{__version__}"  # images/images.sh builds it, kind/cluster.sh loads it
TRAINER = (ROOT / "tests" / "e2e" / "clients" / "snapshot_dataset.py").read_text()
METADATA_PORT = 8080
HEALTH_PORT = 8080
# The hostile program is a small Python one: its pods ask for little, so that the four services fit
# beside the control plane on one 2-core node (the servers' default asks for 250m each).
SMALL = {"requests": {"cpu": "10m", "memory": "64Mi"}}
# What the metadata server hands out, and the secret file a planted ERROR links to.
SECRET = f"instance-credentials-{secrets.token_hex(8)}"
FILE_SECRET = f"TFDATA_TOKEN=kept-from-trainers-{secrets.token_hex(8)}"


def operator_restarts(kubectl: Kubectl) -> dict[str, int]:
    """The operator's pods (by uid) and their containers' restarts: what must not change."""
    pods = kubectl.json("get", "pods", "-n", OPERATOR_NAMESPACE)["items"]
    return {
        p["metadata"]["uid"]: sum(int(c.get("restartCount") or 0) for c in p["status"].get("containerStatuses") or [])
        for p in pods
    }


def container_log(kubectl: Kubectl, namespace: str, pod: str, container: str) -> str:
    return kubectl.run("logs", pod, "-n", namespace, "-c", container, check=False).stdout


def asked(kubectl: Kubectl, namespace: str, name: str) -> set[str]:
    """The paths the operator asked the service's hostile pods for, as container:path."""
    found: set[str] = set()
    for container in ("dispatcher", "worker"):
        found |= asked_in(container_log(kubectl, namespace, f"{name}-{container}-0", container), container)
    return found


@pytest.fixture(scope="module")
def metadata(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """The redirects' target: a pod of the test's that hands SECRET to whoever asks; its address."""
    start_pod(
        kubectl, namespace, "metadata", {"app.kubernetes.io/name": "hostile-metadata"}, "",
        image=HOSTILE_IMAGE, imagePullPolicy="Never", command=["tfdata-server", "metadata"],
        env=[{"name": "HOSTILE_SECRET", "value": SECRET}, {"name": "HOSTILE_PORT", "value": str(METADATA_PORT)}],
    )  # fmt: skip
    pod = wait_for(
        lambda: kubectl.json("get", "pod", "metadata", "-n", namespace), 120, "the metadata pod listening",
        until=lambda p: bool(p["status"].get("podIP")) and "on port" in logs(kubectl, namespace, "metadata"),
        interval=1,
    )  # fmt: skip
    yield f"http://{pod['status']['podIP']}:{METADATA_PORT}{METADATA_PATH}"
    kubectl.run("delete", "pod", "metadata", "-n", namespace, "--wait=false", check=False)


def test_hostile_servers_on_kind_reach_no_status_and_no_redirect_is_followed(
    kubectl: Kubectl, namespace: str, pod_health: PodHealth, metadata: str
) -> None:
    before = operator_restarts(kubectl)
    for mode in MODES:
        service = hostile_service(mode, namespace, mode, metadata, HOSTILE_IMAGE)
        service["spec"]["imagePullPolicy"] = "Never"
        service["spec"]["dispatcher"]["resources"] = service["spec"]["workers"]["resources"] = SMALL
        kubectl.apply(service)
    # Every attack reached the operator on every endpoint it reads, through the NetworkPolicy's
    # operator rule: the dispatcher's /serverinfo and /v1/signals, the unready worker's /readyz.
    wait_for(
        lambda: {m: asked(kubectl, namespace, m) for m in MODES}, 240,
        "the operator to read every hostile pod's endpoints",
        until=lambda seen: all(paths >= READS for paths in seen.values()), interval=2,
        show=lambda: kubectl.run("get", "tfdata,pods", "-n", namespace, "-o", "wide", check=False).stdout,
    )  # fmt: skip
    seen = wait_for(
        lambda: {m: ready_condition(kubectl, namespace, m)[:300] for m in MODES}, 120,
        "a Ready=False status on every hostile service",
        until=lambda found: all(v.startswith("False ") for v in found.values()), interval=2,
    )  # fmt: skip
    print("\n" + "\n".join(f"{mode}: {said}" for mode, said in seen.items()))
    # Two resyncs more (5 s each): every attack is met again, and what the operator wrote stays clean.
    time.sleep(12)
    check_clean(written(kubectl, namespace), SECRET)
    visits = [line for line in logs(kubectl, namespace, "metadata").splitlines() if "asked" in line]
    assert not visits, f"the operator followed a redirect to the metadata server: {visits}"
    assert operator_restarts(kubectl) == before, "the operator's pod restarted (or was replaced)"
    for mode in MODES:
        kubectl.run("delete", "tfdata", mode, "-n", namespace, "--wait=false")


# --- trainers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claim(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A ReadWriteMany claim on the directory every node mounts: A's and B's snapshot volume."""
    name = f"hostile-{namespace}"
    yield shared_claim(kubectl, namespace, name)
    kubectl.run("delete", "pv", name, "--wait=false", check=False)


def service(name: str, namespace: str, directory: str, claim: str) -> dict[str, Any]:
    """A service whose snapshot ``directory`` is its own folder of the shared volume, mounted whole at
    /snapshots in its pods (``spec.snapshots.volume`` would mount it at the directory, one service's
    alone): the dev tier's layout, where A's and B's directories sit side by side on one disk."""
    mounted = {
        "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": claim}}],
        "volumeMounts": [{"name": "shared", "mountPath": "/snapshots"}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
    }
    return service_manifest(
        name,
        {
            "shardingPolicy": "DYNAMIC",
            "dispatcher": mounted,
            "workers": {"replicas": 1, **mounted},
            "snapshots": {"directory": directory},
        },
        namespace,
    )


def tfsnapshot(name: str, namespace: str, svc: str, snapshot_name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "TFDataSnapshot",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"service": svc, "snapshotName": snapshot_name, "deletionPolicy": "Retain"},
    }


def run_pod(
    kubectl: Kubectl, namespace: str, name: str, svc: str, script: str, *args: str, image: str | None = None
) -> str:
    """A trainer's pod of ``svc`` (its client label and settings, the snapshot volume at /snapshots)
    running ``script``; its log, once it succeeded."""
    start_pod(
        kubectl, namespace, name, {"tfdata.dev/client": svc}, script, *args,
        envFrom=[{"configMapRef": {"name": f"{svc}-client"}}],
        volumeMounts=[{"name": "snapshots", "mountPath": "/snapshots"}],
        pod_spec={"volumes": [{"name": "snapshots", "persistentVolumeClaim": {"claimName": "shared"}}]},
        **({"image": image, "imagePullPolicy": "Never"} if image else {}),
    )  # fmt: skip
    phase, log = wait_finished(kubectl, namespace, name, 300)
    assert phase == "Succeeded", log[-3000:]
    return log


# Run in B's trainer pod after tests/fixtures/hostile.py's text (pod_script).
ATTACK = """
import sys
base, a_dir, b_dir, secret_file, secret = sys.argv[1:6]
Path(secret_file).write_text(secret + "\\n")
print("RESULT " + dumps(attack_snapshots(base, a_dir, b_dir, "train", secret_file)), flush=True)
"""
# Floods until ``count`` connections are open (at most ``opening`` seconds), then ``hold`` seconds
# more: the test samples B over FLOOD_SECONDS of them.
FLOOD = """
import sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
opening, hold, a_dir = float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
flood = Flood(host, port, count).start()
deadline, all_open = time.monotonic() + opening, False
while time.monotonic() < deadline:
    print(f"opened {flood.opened}", flush=True)
    if flood.opened >= count and not all_open:
        deadline, all_open = time.monotonic() + hold, True
    time.sleep(1)
print("stopping", flush=True)
flood.stop()
print(f"A {dumps(files(a_dir))}", flush=True)
print(f"done opened {flood.opened}", flush=True)
"""
FLOOD_OPENING = 90.0  # seconds to open every connection
# The flood lasts this long once every connection is open: the test's hold, and time for it to see them.
FLOOD_HOLD = FLOOD_SECONDS + 40


def opened(log: str) -> int:
    counts = [int(line.split()[-1]) for line in log.splitlines() if line.startswith(("opened ", "done opened "))]
    return counts[-1] if counts else 0


def status_of(kubectl: Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return (kubectl.get(kind, name, "-n", namespace) or {}).get("status") or {}


def test_a_trainer_of_b_on_kind_cannot_delete_a_s_data_nor_read_a_secret_nor_stall_b(
    kubectl: Kubectl, namespace: str, pod_health: PodHealth, claim: str
) -> None:
    before = operator_restarts(kubectl)
    # The shared directory is every namespace's: names of this one's.
    a_dir, b_dir = f"/snapshots/{namespace}-a", f"/snapshots/{namespace}-b"
    secret_file = f"/snapshots/{namespace}-secret-env"
    kubectl.apply(service("a", namespace, a_dir, claim))
    kubectl.apply(service("b", namespace, b_dir, claim))
    wait_ready(kubectl, namespace, "a")
    wait_ready(kubectl, namespace, "b")

    # A's completed snapshot, followed by a TFDataSnapshot.
    kubectl.apply(tfsnapshot("a-train", namespace, "a", "train"))
    saved = run_pod(kubectl, namespace, "save", "a", TRAINER, "save", "train", "a", "--elements=40")
    assert f"saved {a_dir}/train" in saved, saved
    wait_for(lambda: status_of(kubectl, namespace, "tfsnap", "a-train"), 120, "A's snapshot COMPLETED",
             until=lambda s: s.get("state") == "COMPLETED", interval=2)  # fmt: skip

    # 1.-3. From B's trainer pod: DELETEs outside B's directory, a planted chunks link, a planted ERROR
    # link to a secret file; then the operator reads the planted snapshot too (a TFDataSnapshot).
    ip = kubectl.json("get", "pod", "b-dispatcher-0", "-n", namespace)["status"]["podIP"]
    base = f"http://{ip}:{HEALTH_PORT}"
    log = run_pod(kubectl, namespace, "attack", "b", pod_script(ATTACK), base, a_dir, b_dir, secret_file,
                  FILE_SECRET, image=HOSTILE_IMAGE)  # fmt: skip
    result = json.loads(next(line[len("RESULT ") :] for line in log.splitlines() if line.startswith("RESULT ")))
    print(f"\nwhat B's dispatcher answered: { {k: v for k, v in result.items() if not k.startswith('a_')} }")
    check_attack(result, FILE_SECRET)
    a_files = result["a_before"]
    kubectl.apply(tfsnapshot("b-leak", namespace, "b", "leak"))
    read = wait_for(lambda: status_of(kubectl, namespace, "tfsnap", "b-leak"), 120,
                    "the operator to read the planted snapshot (the dispatcher's answer names the link)",
                    until=lambda s: "symbolic link" in s.get("message", ""), interval=2)  # fmt: skip
    print(f"the planted ERROR link, as the operator reports it: {json.dumps(read)}")

    # 4. B's health port flooded from B's trainer pod: B stays Ready, sampled.
    start_pod(
        kubectl, namespace, "flood", {"tfdata.dev/client": "b"}, pod_script(FLOOD), ip, str(HEALTH_PORT),
        str(FLOOD_CONNECTIONS), str(FLOOD_OPENING), str(FLOOD_HOLD), a_dir, image=HOSTILE_IMAGE,
        imagePullPolicy="Never", volumeMounts=[{"name": "snapshots", "mountPath": "/snapshots"}],
        pod_spec={"volumes": [{"name": "snapshots", "persistentVolumeClaim": {"claimName": "shared"}}]},
    )  # fmt: skip
    wait_for(lambda: opened(logs(kubectl, namespace, "flood")), FLOOD_OPENING, f"{FLOOD_CONNECTIONS} connections open",
             until=lambda n: n >= FLOOD_CONNECTIONS, interval=1)  # fmt: skip
    samples = holds_for(
        lambda: (ready_condition(kubectl, namespace, "b"), pod_ready(kubectl, namespace, "b-dispatcher-0")),
        FLOOD_SECONDS,
        "B Ready while its health port is flooded",
        ok=lambda seen: seen[0].startswith("True ") and seen[1],
        interval=0.5,
    )
    assert "stopping" not in logs(kubectl, namespace, "flood"), "the flood ended before B's hold did"
    phase, log = wait_finished(kubectl, namespace, "flood", FLOOD_OPENING + 120)
    assert phase == "Succeeded", log[-3000:]
    count = opened(log)
    print(f"B stayed Ready over {samples} samples in {FLOOD_SECONDS:.0f}s; the flood opened {count} connections")
    assert count > FLOOD_CONNECTIONS, "the server closed none of the flood's connections: the cap was never met"

    # Nothing of A went, the secret is nowhere the operator wrote, and the operator never restarted.
    after = json.loads(next(line[2:] for line in log.splitlines() if line.startswith("A ")))
    assert after == a_files, "some of A's files went during the flood"
    check_clean(written(kubectl, namespace), FILE_SECRET)
    assert operator_restarts(kubectl) == before, "the operator's pod restarted (or was replaced)"
    for name in ("b-leak", "a-train"):
        kubectl.run("delete", "tfsnap", name, "-n", namespace, "--timeout=60s", timeout=70)
