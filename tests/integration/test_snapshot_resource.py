"""A TFDataSnapshot through its states, its finalizer and its deletion, on a real API server.

As in test_snapshots_hold.py, the operator runs as a process and the service's dispatcher is a
fake this test serves on 127.0.0.1 (support.Pages): its /v1/snapshots?path=... says what the test
sets, and its DELETE is recorded. The CRD's rules, the finalizer, the status, the printer columns
and the Events are the real API server's.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from tfdata_operator.api.identity import SNAPSHOT_FINALIZER
from tfdata_operator.plan import snapshot as plansnap
from tfdata_operator.wire.signals import SIGNALS_PATH
from tfdata_operator.wire.snapshots import SNAPSHOTS_PATH, SnapshotProgress, SnapshotsReport

from fixtures.manifests import API_VERSION
from fixtures.support import (
    Kubectl,
    OperatorProcess,
    Pages,
    apply_on_fake_dispatcher,
    holds_for,
    service_signals,
    wait_for,
)

NAME = "saver"
DIRECTORY = "gs://bucket/tfdata"
SNAPSHOT = "imagenet-v3"
PATH = f"{DIRECTORY}/{SNAPSHOT}"
QUERY = f"{SNAPSHOTS_PATH}?{urllib.parse.urlencode({'path': PATH})}"
# A snapshot that may still change is read every POLL_SECONDS.
TIMEOUT = plansnap.POLL_SECONDS + 30
# A wait is sampled over more than one read of the snapshot.
HOLD = plansnap.POLL_SECONDS * 1.5


def answer(state: str, **counts: Any) -> str:
    progress = SnapshotProgress(PATH, state, journaled=True, started_at=1.0e9 if state != "MISSING" else None, **counts)
    return SnapshotsReport((progress,), "snapshots named in the journal").to_json()


def served_state(page: str | None) -> str | None:
    """The state the fake's answer gave the snapshot (None: it answered nothing)."""
    progress = SnapshotsReport.from_json(page).get(PATH) if page is not None else None
    return progress.state if progress is not None else None


def snapshot_reads(pages: Pages) -> int:
    return sum(r.startswith(SNAPSHOTS_PATH) for r in pages.requests)


@pytest.fixture(scope="module")
def dispatcher() -> Iterator[Pages]:
    pages = Pages({SIGNALS_PATH: service_signals(False, idle_seconds=60).to_json(), QUERY: answer("MISSING")})
    yield pages
    pages.close()


@pytest.fixture(scope="module")
def service(kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher: Pages) -> Iterator[None]:
    spec = {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 1}, "snapshots": {"directory": DIRECTORY}}
    apply_on_fake_dispatcher(kubectl, namespace, NAME, dispatcher, spec)

    def dispatcher_pod() -> str | None:
        pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}")["items"]
        running = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return next((n for n in running if "dispatcher" in n), None)

    pod = wait_for(dispatcher_pod, 90, "the dispatcher pod Running on kwok's node")
    ip = {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    kubectl.run("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(ip))
    yield


def snapshot(name: str, service: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "TFDataSnapshot",
        "metadata": {"name": name},
        "spec": {"service": service, **spec},
    }


def status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return (kubectl.get("tfdatasnapshot", name, "-n", namespace) or {}).get("status") or {}


def reasons(kubectl: Kubectl, namespace: str, name: str) -> list[tuple[str, str]]:
    selector = f"involvedObject.kind=TFDataSnapshot,involvedObject.name={name}"
    listed = kubectl.json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return [(e["type"], e["reason"]) for e in listed]


def test_a_snapshot_is_followed_through_its_states_and_deleted_with_its_data_once_written(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher: Pages, service: None
) -> None:
    kubectl.apply({**snapshot(SNAPSHOT, NAME, deletionPolicy="Delete"), "metadata": {"name": SNAPSHOT,
                   "namespace": namespace}})  # fmt: skip
    pending = wait_for(lambda: status(kubectl, namespace, SNAPSHOT), TIMEOUT, "TRIGGER_PENDING, waiting for a save",
                       until=lambda s: s.get("reason") == plansnap.WAITING_FOR_SAVE, show=operator.tail)  # fmt: skip
    assert pending["state"] == "TRIGGER_PENDING" and pending["path"] == PATH, pending
    assert f"snapshots.save(dataset, '{SNAPSHOT}', '{NAME}')" in pending["message"]
    assert SNAPSHOT_FINALIZER in kubectl.get("tfdatasnapshot", SNAPSHOT, "-n", namespace)["metadata"]["finalizers"]

    # A trainer's save: the dispatcher's files say it is being written.
    dispatcher.pages[QUERY] = answer("IN_PROGRESS", streams_total=2, streams_done=1, chunks=3, elements=90)
    wait_for(lambda: status(kubectl, namespace, SNAPSHOT), TIMEOUT, "IN_PROGRESS with progress",
             until=lambda s: s.get("state") == "IN_PROGRESS" and s.get("elements") == 90)  # fmt: skip
    columns = kubectl.run("get", "tfsnap", SNAPSHOT, "-n", namespace, "--no-headers").stdout.split()
    assert columns[:4] == [SNAPSHOT, NAME, "IN_PROGRESS", "1/2"] and columns[4] == "90", columns
    assert ("Normal", "SnapshotStarted") in reasons(kubectl, namespace, SNAPSHOT)

    # The CRD keeps a snapshot on its service.
    moved = kubectl.run("patch", "tfsnap", SNAPSHOT, "-n", namespace, "--type=merge", "-p",
                        '{"spec":{"service":"other"}}', check=False)  # fmt: skip
    assert moved.returncode != 0 and "spec.service cannot change" in moved.stderr, moved.stderr

    # Deleted while it is written: it waits, and nothing is deleted, across more than one read.
    kubectl.run("delete", "tfsnap", SNAPSHOT, "-n", namespace, "--wait=false")
    wait_for(lambda: status(kubectl, namespace, SNAPSHOT), TIMEOUT, "the deletion to wait",
             until=lambda s: s.get("reason") == plansnap.DELETION_WAITS)  # fmt: skip
    reads = snapshot_reads(dispatcher)
    holds_for(lambda: (status(kubectl, namespace, SNAPSHOT).get("reason"), list(dispatcher.deleted)), HOLD,
              "the deletion waiting while the snapshot is written",
              ok=lambda seen: seen == (plansnap.DELETION_WAITS, []))  # fmt: skip
    assert snapshot_reads(dispatcher) > reads, "the operator did not read the snapshot again while it waited"

    # Once written, the data is deleted by the dispatcher and the resource goes.
    dispatcher.pages[QUERY] = answer("COMPLETED", streams_total=2, streams_done=2, chunks=4, elements=120)
    wait_for(lambda: kubectl.get("tfdatasnapshot", SNAPSHOT, "-n", namespace) is None, TIMEOUT,
             "the snapshot deleted once completed", show=lambda: status(kubectl, namespace, SNAPSHOT))  # fmt: skip
    # Each DELETE came while the dispatcher said the snapshot was COMPLETED (the rule:
    # plan/snapshotdeletion.py deletes the data of a final snapshot only, never one being written).
    assert [(path, served_state(page)) for path, page in dispatcher.deletes] == [(QUERY, "COMPLETED")], (
        dispatcher.deletes
    )
    said = reasons(kubectl, namespace, SNAPSHOT)
    assert ("Normal", "SnapshotCompleted") in said and ("Normal", plansnap.DATA_DELETED) in said, said


def test_a_snapshot_of_a_missing_service_says_why_and_goes_without_deleting(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher: Pages, service: None
) -> None:
    kubectl.apply({**snapshot("orphan", "absent", deletionPolicy="Delete"), "metadata": {"name": "orphan",
                   "namespace": namespace}})  # fmt: skip
    seen = wait_for(lambda: status(kubectl, namespace, "orphan"), TIMEOUT, "ServiceNotFound",
                    until=lambda s: s.get("reason") == plansnap.SERVICE_NOT_FOUND)  # fmt: skip
    assert seen["state"] == "TRIGGER_PENDING" and "TFDataService absent does not exist" in seen["message"]
    wait_for(lambda: (kubectl.get("tfdatasnapshot", "orphan", "-n", namespace) or {}).get("metadata", {}),
             TIMEOUT, "the finalizer", until=lambda m: SNAPSHOT_FINALIZER in (m.get("finalizers") or []))  # fmt: skip
    # Nothing was ever written for it: it goes, with nothing to delete or to warn about.
    kubectl.run("delete", "tfsnap", "orphan", "-n", namespace, "--timeout=60s")
    assert ("Warning", plansnap.DATA_KEPT) not in reasons(kubectl, namespace, "orphan")
    assert dispatcher.deleted in ([], [QUERY])  # only the first test's

    retained = {**snapshot("kept", NAME), "metadata": {"name": "kept", "namespace": namespace}}
    kubectl.apply(retained)
    wait_for(lambda: status(kubectl, namespace, "kept"), TIMEOUT, "a status", until=lambda s: "state" in s)
    assert "finalizers" not in kubectl.get("tfdatasnapshot", "kept", "-n", namespace)["metadata"]
    kubectl.run("delete", "tfsnap", "kept", "-n", namespace, "--timeout=30s")

    bad = kubectl.run("apply", "-n", namespace, "-f", "-", check=False,
                      input=json.dumps(snapshot("bad", NAME, snapshotName="../etc")))  # fmt: skip
    assert bad.returncode != 0 and "snapshotName" in bad.stderr, bad.stderr
