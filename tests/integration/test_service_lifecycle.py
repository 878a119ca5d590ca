"""spec.lifecycle on the dev cluster: a service tied to a batch/v1 Job suspends a set time after the
Job completes and is deleted with it; an idle service suspends and resumes on `kubectl patch`.

The Job is real and completes for real: it is created suspended (no pod), then resumed with a
toleration of kwok's node (mutable while a Job never ran, as Kueue does it), where kwok runs its pod
to Succeeded and the Job controller marks it Complete. Its deletion is the garbage collector's, from
the ownerReference the operator set. The idle service's dispatcher answers /v1/signals from a fake
this test serves on 127.0.0.1 (support.Pages), as in test_drains_wait.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from tfdata_operator.wire.signals import SIGNALS_PATH

import devcluster
from fixtures.manifests import API_VERSION
from fixtures.support import (
    Kubectl,
    OperatorProcess,
    Pages,
    apply_on_fake_dispatcher,
    holds_for,
    kubelet_nodes,
    service_signals,
    wait_for,
)

# Longer than the operator takes to see that the Job finished (it reads a running Job again every
# lifecycle.WORKLOAD_RECHECK_SECONDS, each read kept run.NODE_READ_SECONDS), so that the
# planned suspend is seen before it is due.
AFTER_SECONDS = 18
IDLE_SECONDS = 6


def parse(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def tfdata(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return kubectl.get("tfdata", name, "-n", namespace) or {}


def lifecycle_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return (tfdata(kubectl, namespace, name).get("status") or {}).get("lifecycle") or {}


def suspended(kubectl: Kubectl, namespace: str, name: str) -> bool:
    return bool((tfdata(kubectl, namespace, name).get("spec") or {}).get("suspend"))


def replicas(kubectl: Kubectl, namespace: str, sts: str) -> int | None:
    found = kubectl.get("statefulset", sts, "-n", namespace)
    return None if found is None else int(found["spec"]["replicas"])


def events(kubectl: Kubectl, namespace: str, name: str) -> list[tuple[str, str]]:
    listed = kubectl.json("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    return [(e["reason"], e["message"]) for e in listed["items"]]


def test_a_service_suspends_after_its_job_completes_and_is_deleted_with_it(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    if kubelet_nodes(kubectl.json("get", "nodes")):
        pytest.skip("the Job's pod completes on kwok's node, which only the node-less dev cluster has")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": namespace},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": "trainer:never-pulled"}],
                }
            },
        },
    }
    kubectl.apply(job)
    name = "feeds-train"
    kubectl.apply(
        {
            "apiVersion": API_VERSION,
            "kind": "TFDataService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "shardingPolicy": "DYNAMIC",
                "lifecycle": {
                    "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "train"},
                    "afterWorkloadFinishes": {"action": "Suspend", "afterSeconds": AFTER_SECONDS},
                    "deleteWithWorkload": True,
                },
            },
        }
    )
    # A second service on the same Job, deleted by the operator as soon as the Job finished.
    kubectl.apply(
        {
            "apiVersion": API_VERSION,
            "kind": "TFDataService",
            "metadata": {"name": "once", "namespace": namespace},
            "spec": {
                "shardingPolicy": "DYNAMIC",
                "lifecycle": {
                    "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "train"},
                    "afterWorkloadFinishes": {"action": "Delete"},
                },
            },
        }
    )
    job_uid = kubectl.json("get", "job", "train", "-n", namespace)["metadata"]["uid"]
    show = lambda: (tfdata(kubectl, namespace, name), operator.tail())  # noqa: E731

    def tied() -> bool:
        svc = tfdata(kubectl, namespace, name)
        refs = svc["metadata"].get("ownerReferences") or []
        return any(r["uid"] == job_uid and r["kind"] == "Job" for r in refs) and (
            ((svc.get("status") or {}).get("lifecycle") or {}).get("workload", {}).get("state") == "Running"
        )

    wait_for(tied, 60, "the service tied to its running Job", show=show)
    assert replicas(kubectl, namespace, f"{name}-worker") == 2 and not suspended(kubectl, namespace, name)

    # The Job starts on kwok's node, whose pod turns Succeeded: the Job controller marks it Complete.
    toleration = {"spec": {"suspend": False, "template": {"spec": {"tolerations": [devcluster.KWOK_TOLERATION]}}}}
    kubectl.run("patch", "job", "train", "-n", namespace, "--type=merge", "-p", json.dumps(toleration))

    def complete() -> str | None:
        conditions = (kubectl.json("get", "job", "train", "-n", namespace).get("status") or {}).get("conditions")
        return next((c["lastTransitionTime"] for c in conditions or [] if c["type"] == "Complete"), None)

    finished_at = parse(wait_for(complete, 60, "the Job to complete on kwok's node"))
    wait_for(lambda: kubectl.get("tfdata", "once", "-n", namespace) is None, 30,
             "the operator to delete the service whose Job finished (action Delete)",
             show=lambda: (tfdata(kubectl, namespace, "once"), operator.tail()))  # fmt: skip
    assert any(r == "LifecycleDelete" for r, _ in events(kubectl, namespace, "once"))
    due = finished_at.timestamp() + AFTER_SECONDS
    planned = wait_for(lambda: lifecycle_status(kubectl, namespace, name).get("nextAction"), 30,
                       "status.lifecycle.nextAction after the Job completed", show=show)  # fmt: skip
    assert planned["action"] == "Suspend" and parse(planned["at"]).timestamp() == due, planned
    said = dict(events(kubectl, namespace, name))
    assert "will be suspended at" in said.get("WorkloadFinished", ""), said
    # Until then the service serves on: sampled, not read once.
    if (left := due - time.time() - 0.5) > 0:
        holds_for(lambda: suspended(kubectl, namespace, name), left, "the service running before afterSeconds",
                  ok=lambda s: not s)  # fmt: skip
    wait_for(lambda: suspended(kubectl, namespace, name), 30, "spec.suspend set after the Job completed", show=show)
    print(f"suspended {time.time() - due:.1f} s after the planned time")
    acted = parse(lifecycle_status(kubectl, namespace, name)["workload"]["actedAt"])
    assert acted.timestamp() >= due, (acted, due)
    wait_for(lambda: replicas(kubectl, namespace, f"{name}-worker"), 60, "the workers scaled to 0",
             until=lambda n: n == 0, show=show)  # fmt: skip
    assert replicas(kubectl, namespace, f"{name}-dispatcher") == 0
    assert kubectl.get("service", f"{name}-dispatcher", "-n", namespace) is not None  # the address stays
    assert "LifecycleSuspend" in dict(events(kubectl, namespace, name))

    # The Job goes, and the garbage collector takes the service with it (and its children with that).
    kubectl.run("delete", "job", "train", "-n", namespace, "--cascade=background", "--wait=false")
    wait_for(lambda: kubectl.get("tfdata", name, "-n", namespace) is None, 60,
             "the garbage collector to delete the service with its Job", show=show)  # fmt: skip
    wait_for(lambda: kubectl.get("statefulset", f"{name}-dispatcher", "-n", namespace) is None, 60,
             "the service's StatefulSets deleted with it")  # fmt: skip


@pytest.fixture(scope="module")
def dispatcher_signals() -> Iterator[Pages]:
    pages = Pages({SIGNALS_PATH: service_signals(True).to_json()})
    yield pages
    pages.close()


def point_dispatcher_at_fake(kubectl: Kubectl, namespace: str, name: str) -> None:
    """The running dispatcher pod's address becomes 127.0.0.1, where the fake answers on its health port."""

    def running() -> str | None:
        pod = kubectl.get("pod", f"{name}-dispatcher-0", "-n", namespace) or {}
        ok = (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
        return pod["metadata"]["name"] if ok else None

    pod = wait_for(running, 60, "the dispatcher Running on kwok's node")
    ip = {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    kubectl.run("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(ip))


def test_an_idle_service_suspends_and_resumes_on_kubectl_patch(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher_signals: Pages
) -> None:
    name = "sleepy"
    spec = {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 1},
            "lifecycle": {"idle": {"suspendAfterSeconds": IDLE_SECONDS}}}  # fmt: skip
    apply_on_fake_dispatcher(kubectl, namespace, name, dispatcher_signals, spec)
    show = lambda: (tfdata(kubectl, namespace, name), operator.tail())  # noqa: E731
    point_dispatcher_at_fake(kubectl, namespace, name)
    wait_for(lambda: lifecycle_status(kubectl, namespace, name).get("lastReadTime"), 60,
             "status.lifecycle.lastReadTime from the dispatcher's signal", show=show)  # fmt: skip
    # A client reads: the service stays up past suspendAfterSeconds (the operator reads again when due).
    holds_for(lambda: suspended(kubectl, namespace, name), IDLE_SECONDS + 3, "the service up while a client reads",
              ok=lambda s: not s)  # fmt: skip
    assert lifecycle_status(kubectl, namespace, name)["nextAction"]["why"] == "Idle"

    # Nobody has read for longer than suspendAfterSeconds: suspended, its address kept.
    dispatcher_signals.pages[SIGNALS_PATH] = service_signals(False, idle_seconds=IDLE_SECONDS + 1).to_json()
    wait_for(lambda: suspended(kubectl, namespace, name), IDLE_SECONDS + 30, "the idle service suspended", show=show)
    seen = lifecycle_status(kubectl, namespace, name)
    assert seen["secondsSinceLastRead"] >= IDLE_SECONDS, seen
    assert any(r == "LifecycleSuspend" and "No client has read" in m for r, m in events(kubectl, namespace, name))
    wait_for(lambda: replicas(kubectl, namespace, f"{name}-dispatcher"), 60, "the dispatcher scaled to 0",
             until=lambda n: n == 0, show=show)  # fmt: skip
    address = tfdata(kubectl, namespace, name)["status"]["dispatcherAddress"]

    # Resumed by hand: the same service comes back at the same address, and the idle clock starts anew.
    dispatcher_signals.pages[SIGNALS_PATH] = service_signals(True).to_json()
    kubectl.run("patch", "tfdata", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: replicas(kubectl, namespace, f"{name}-dispatcher"), 60, "the dispatcher back",
             until=lambda n: n == 1, show=show)  # fmt: skip
    point_dispatcher_at_fake(kubectl, namespace, name)
    reads = len(dispatcher_signals.requests)
    holds_for(lambda: suspended(kubectl, namespace, name), IDLE_SECONDS + 2, "the resumed service up while read",
              ok=lambda s: not s)  # fmt: skip
    assert len(dispatcher_signals.requests) > reads, "the operator never read the resumed dispatcher's signal"
    assert tfdata(kubectl, namespace, name)["status"]["dispatcherAddress"] == address
