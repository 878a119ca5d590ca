"""The watches' cache (trimmed bodies, the overlay of the operator's own writes, recent reads) and the work queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tfdata_operator.api import identity
from tfdata_operator.controller import cache
from tfdata_operator.controller.workqueue import WorkQueue, backoff

from fixtures.manifests import API_VERSION

KEY = ("ml", "demo")


def sts(name: str, version: str, replicas: int = 2) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "resourceVersion": version,
            "managedFields": [{"m": 1}],
        },
        "spec": {"replicas": replicas},
    }


def test_trim_drops_managed_fields_and_kubectls_copy_but_keeps_the_rest() -> None:
    body = sts("demo-worker", "5")
    body["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "{...}",
        "keep": "me",
    }
    trimmed = cache.trim(body)
    assert "managedFields" not in trimmed["metadata"]
    assert trimmed["metadata"]["annotations"] == {"keep": "me"}
    assert trimmed["spec"] == {"replicas": 2}
    assert "managedFields" in body["metadata"]  # the watch's own body is not changed


def test_a_packed_body_unpacks_to_the_same_body_each_time_a_fresh_copy() -> None:
    body = cache.trim(sts("demo-worker", "5"))
    body["spec"]["template"] = {"spec": {"containers": [{"name": "server", "args": ["--port", "5050"]}]}}
    body["status"] = {"readyReplicas": 2, "ratio": 0.5, "paused": False, "note": None, "text": "añ ✓"}
    packed = cache.pack(body)
    first = packed.unpack()
    assert first == body and list(first) == list(body)  # same content, same key order
    first["spec"]["replicas"] = 9  # a reconcile that changes what it was given changes nothing kept
    assert packed.unpack() == body
    assert len(packed.data) < len(repr(body))


def test_a_trimmed_pod_keeps_what_the_scaling_decisions_read() -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "demo-worker-0",
            "namespace": "ml",
            "uid": "u",
            "labels": {"a": "b"},
            "creationTimestamp": "t",
            "managedFields": [1],
            "ownerReferences": [{"uid": "o"}],
        },
        "spec": {"containers": [{"name": "server", "image": "big"}], "nodeName": "node-a"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "server", "ready": True, "started": True, "image": "x"}],
        },
    }
    trimmed = cache.trim_pod(pod)
    # Of the spec only the node, whose loss the operator acts on (spec.nodeLoss).
    assert trimmed["spec"] == {"nodeName": "node-a"} and "managedFields" not in trimmed["metadata"]
    assert trimmed["metadata"]["ownerReferences"] == [{"uid": "o"}]
    # The image a container runs stays: an image that cannot serve is named in the conditions.
    assert trimmed["status"]["containerStatuses"] == [{"name": "server", "image": "x", "ready": True, "started": True}]


def test_a_trimmed_pod_keeps_why_it_is_not_scheduled_or_not_running() -> None:
    long = "x" * 5000
    pod = {
        "kind": "Pod",
        "metadata": {"name": "demo-worker-0", "namespace": "ml"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/1 nodes are available", "lastProbeTime": None}],
            "containerStatuses": [
                {
                    "name": "server",
                    "ready": False,
                    "restartCount": 3,
                    "imageID": "sha256:...",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": long,
                                                 "containerID": "c", "finishedAt": "t"}},
                }
            ],
        },
    }  # fmt: skip
    trimmed = cache.trim_pod(pod)
    assert trimmed["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}
    ]
    (container,) = trimmed["status"]["containerStatuses"]
    assert container["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}
    terminated = container["lastState"]["terminated"]
    assert terminated.keys() == {"exitCode", "reason", "message"} and len(terminated["message"]) == 1024
    assert "initContainerStatuses" not in trimmed["status"]


def test_a_trimmed_pod_keeps_an_init_container_only_while_it_holds_the_pod_back() -> None:
    def pod(state: dict[str, Any]) -> dict[str, Any]:
        init = {"name": "inject-server-program", "image": "tfdata-operator:0.1.0", "ready": False, "state": state}
        return {"kind": "Pod", "metadata": {"name": "x-0"}, "status": {"initContainerStatuses": [init]}}

    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    (kept,) = cache.trim_pod(pod(waiting))["status"]["initContainerStatuses"]
    assert kept["state"] == waiting and kept["image"] == "tfdata-operator:0.1.0"
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    assert "initContainerStatuses" not in cache.trim_pod(pod(done))["status"]


def test_instance_of_reads_the_instance_label() -> None:
    body = {"metadata": {"namespace": "ml", "labels": {identity.INSTANCE_LABEL: "demo"}}}
    assert cache.instance_of(body) == KEY
    assert cache.instance_of({"metadata": {"namespace": "ml"}}) is None


def test_the_overlay_shows_a_write_until_the_watch_delivers_it() -> None:
    now = [0.0]
    overlay = cache.Overlay(ttl=30, clock=lambda: now[0])
    overlay.record(KEY, sts("demo-worker", "7", replicas=3))
    older = {("StatefulSet", "demo-worker"): sts("demo-worker", "6")}
    assert overlay.merge(KEY, older)[("StatefulSet", "demo-worker")]["spec"]["replicas"] == 3
    caught_up = {("StatefulSet", "demo-worker"): sts("demo-worker", "7", replicas=3)}
    assert overlay.merge(KEY, caught_up) == caught_up
    assert len(overlay) == 0


def test_the_overlay_shows_a_created_object_the_watch_has_not_seen_and_forgets_it_after_its_ttl() -> None:
    now = [0.0]
    overlay = cache.Overlay(ttl=30, clock=lambda: now[0])
    overlay.record(KEY, sts("demo-worker", "7"))
    assert ("StatefulSet", "demo-worker") in overlay.merge(KEY, {})
    now[0] = 31
    assert overlay.merge(KEY, {}) == {}
    assert len(overlay) == 0


def test_a_newer_watch_event_overrides_the_overlay() -> None:
    overlay = cache.Overlay()
    overlay.record(KEY, sts("demo-worker", "7", replicas=3))
    newer = {("StatefulSet", "demo-worker"): sts("demo-worker", "9", replicas=5)}
    assert overlay.merge(KEY, newer) == newer


def test_a_trimmed_event_keeps_what_a_diagnosis_reads() -> None:
    event = {
        "metadata": {"name": "journal-x-0.1", "managedFields": [{"m": 1}]},
        "involvedObject": {"kind": "PersistentVolumeClaim", "name": "journal-x-0", "uid": "u", "apiVersion": "v1"},
        "type": "Warning",
        "reason": "ProvisioningFailed",
        "message": "m" * 5000,
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "series": {"lastObservedTime": "2026-01-01T00:01:00Z", "count": 3},
        "source": {"component": "persistentvolume-controller"},
    }
    trimmed = cache.trim_event(event)
    assert trimmed == {
        "involvedObject": {"kind": "PersistentVolumeClaim", "name": "journal-x-0", "uid": "u"},
        "type": "Warning",
        "reason": "ProvisioningFailed",
        "message": "m" * 1024,
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "series": {"lastObservedTime": "2026-01-01T00:01:00Z", "count": 3},
    }


def test_a_recent_read_is_read_again_only_after_its_ttl_and_expired_ones_are_forgotten() -> None:
    recent: cache.Recent[int] = cache.Recent()
    reads: list[str] = []

    def read(key: str) -> int:
        reads.append(key)
        return len(reads)

    assert recent.get("a", lambda: read("a"), now=0, ttl=60) == 1
    assert recent.get("a", lambda: read("a"), now=59.9, ttl=60) == 1
    assert recent.get("b", lambda: read("b"), now=30, ttl=60) == 2
    assert recent.get("a", lambda: read("a"), now=60, ttl=60) == 3
    assert reads == ["a", "b", "a"]
    recent.get("c", lambda: read("c"), now=90, ttl=60)
    assert len(recent) == 3 and recent.last("b") == 2  # "b", read at 30, has expired a moment ago
    recent.get("c", lambda: read("c"), now=150, ttl=60)  # "b" expired a whole ttl ago: forgotten
    assert len(recent) == 2 and recent.last("b") is None


def test_a_read_that_fails_is_not_kept() -> None:
    recent: cache.Recent[int] = cache.Recent()

    def fail() -> int:
        raise OSError("unreachable")

    with pytest.raises(OSError):
        recent.get("a", fail, now=0, ttl=60)
    assert recent.get("a", lambda: 7, now=1, ttl=60) == 7


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [backoff(n) for n in (1, 2, 3, 7, 8, 20)] == [1, 2, 4, 60, 60, 60]


def test_a_burst_for_one_service_becomes_one_reconcile_and_a_change_during_it_one_more() -> None:
    async def scenario() -> list:
        queue = WorkQueue()
        ran: list = []
        release = asyncio.Event()

        async def worker(key: object) -> bool:
            ran.append(key)
            if len(ran) == 1:
                await release.wait()
            return True

        for _ in range(50):
            queue.add(KEY)
        queue.add(("ml", "other"))
        assert len(queue) == 2
        drain = asyncio.create_task(queue.drain(worker))
        await asyncio.sleep(0.01)
        for _ in range(10):  # while its reconcile runs
            queue.add(KEY)
        assert len(queue) == 1  # only "other" waits; KEY is marked to run once more
        release.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(ran) == 3:
                break
        drain.cancel()
        return ran

    assert asyncio.run(scenario()) == [KEY, ("ml", "other"), KEY]


def test_a_failed_reconcile_is_retried_after_its_backoff_not_at_once() -> None:
    async def scenario() -> list[float]:
        queue = WorkQueue()
        loop = asyncio.get_running_loop()
        times: list[float] = []

        async def worker(key: object) -> bool:
            times.append(loop.time())
            if len(times) < 3:
                queue.add(KEY)  # an event during a failing attempt must not skip the backoff
                return False
            return True

        queue.add(KEY)
        drain = asyncio.create_task(queue.drain(worker))
        for _ in range(600):
            await asyncio.sleep(0.01)
            if len(times) >= 3:
                break
        drain.cancel()
        return times

    times = asyncio.run(scenario())
    assert len(times) == 3, times
    assert times[1] - times[0] == pytest.approx(1.0, abs=0.2)
    assert times[2] - times[1] == pytest.approx(2.0, abs=0.2)


def test_a_background_read_never_blocks_and_its_answer_is_kept_while_asked_for() -> None:
    import threading

    from tfdata_operator.controller.cache import Background

    release, calls = threading.Event(), []

    def read() -> str | None:
        calls.append(1)
        release.wait(5)
        return "2.16.2" if len(calls) > 1 else None

    reads: Background[str] = Background()
    assert reads.get("pod-a", read, now=0.0, ttl=60.0) is None  # returns at once; the read runs apart
    assert reads.reading("pod-a")
    assert reads.get("pod-a", read, now=1.0, ttl=60.0) is None and len(calls) == 1  # one read at a time
    release.set()
    reads.wait()
    # No answer (the pod did not answer): tried again only after ttl.
    assert reads.get("pod-a", read, now=30.0, ttl=60.0) is None and len(calls) == 1
    reads.get("pod-a", read, now=61.0, ttl=60.0)
    reads.wait()
    assert reads.get("pod-a", read, now=62.0, ttl=60.0) == "2.16.2"
    assert reads.get("pod-a", read, now=100.0, ttl=60.0) == "2.16.2" and len(calls) == 2  # kept: never read again
    # A key nobody asked for in ttl is forgotten (its pod is gone).
    reads.get("pod-b", lambda: None, now=200.0, ttl=60.0)
    assert len(reads) == 0


def test_a_snapshots_body_is_kept_without_what_a_tenant_can_grow() -> None:
    body = {
        "metadata": {
            "name": "s", "namespace": "ml", "uid": "u", "finalizers": ["tfdata.dev/snapshot-data"],
            "creationTimestamp": "2026-11-28T10:00:00Z", "annotations": {"big": "x" * 200_000},
            "labels": {f"team.example.com/k{i}": "v" * 63 for i in range(2000)}, "generation": 3,
            "resourceVersion": "41", "ownerReferences": [{"kind": "TFDataService", "name": "svc"}] * 100,
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 50,
        },
        "spec": {"service": "svc", "deletionPolicy": "Delete"},
        "status": {"state": "COMPLETED"},
    }  # fmt: skip
    kept = cache.trim_snapshot(body)
    assert kept == {
        "apiVersion": API_VERSION, "kind": "TFDataSnapshot",
        "metadata": {"name": "s", "namespace": "ml", "uid": "u", "finalizers": ["tfdata.dev/snapshot-data"],
                     "creationTimestamp": "2026-11-28T10:00:00Z", "generation": 3, "resourceVersion": "41"},
        "spec": {"service": "svc", "deletionPolicy": "Delete"}, "status": {"state": "COMPLETED"},
    }  # fmt: skip
