"""The kind tier's pod health check (tests/kind/podhealth.py) on pod statuses and logs as a kubelet
and our programs write them: what counts as a restart and as an error, and what a test's
expectation excuses."""

from __future__ import annotations

import re
from typing import Any

from kind.podhealth import Expected, LoggedError, PodRecord, error_lines, on_frozen_node, problems, tracked, update

SERVER_LABELS = {
    "app.kubernetes.io/name": "tfdata-service",
    "app.kubernetes.io/instance": "svc",
    "app.kubernetes.io/component": "dispatcher",
}


def pod(uid: str, *containers: dict[str, Any], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "svc-dispatcher-0", "uid": uid, "labels": SERVER_LABELS}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:10Z"
    return {"metadata": meta, "status": {"containerStatuses": list(containers)}}


def running(container_id: str, restarts: int = 0, last: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": "dispatcher",
        "containerID": container_id,
        "restartCount": restarts,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    }
    if last:
        status["lastState"] = {"terminated": {"containerID": last, "exitCode": 1, "reason": "Error"}}
    return status


def record(uid: str = "u1") -> PodRecord:
    return PodRecord("ns", "svc-dispatcher-0", uid, "dispatcher of svc")


def expect(pod: str = "svc-dispatcher-0", restarts: bool = False, errors: str | None = None) -> Expected:
    return Expected("ns", re.compile(pod), "the test does it", restarts, re.compile(errors) if errors else None)


def test_it_watches_the_operators_namespace_and_the_tiers_servers_only() -> None:
    assert tracked(pod("u1"), {"ns"}) == "dispatcher of svc"
    assert tracked(pod("u1"), {"other"}) is None
    assert tracked({"metadata": {"namespace": "tfdata-system", "name": "op", "uid": "u"}}, set()) == "the operator"
    client = {"metadata": {"namespace": "ns", "name": "client", "uid": "u", "labels": {"app": "x"}}}
    assert tracked(client, {"ns"}) is None


def test_each_container_instance_is_read_once_the_current_one_followed() -> None:
    seen = record()
    assert update(seen, pod("u1", running("c1")), gone=False) == [("dispatcher", 0, False)]
    assert update(seen, pod("u1", running("c1")), gone=False) == []
    # It crashed and runs again: the new instance is followed, the one that crashed was already read.
    assert update(seen, pod("u1", running("c2", restarts=1, last="c1")), gone=False) == [("dispatcher", 1, False)]
    # Two crashes between events: the one never seen is read as the previous instance.
    reads = update(seen, pod("u1", running("c4", restarts=3, last="c3")), gone=False)
    assert reads == [("dispatcher", 3, False), ("dispatcher", 2, True)]
    assert seen.restarts == {"dispatcher": 3}
    assert seen.last_exits["dispatcher"].startswith("exit code 1 (Error)")


def test_an_init_container_that_restarted_is_reported_and_its_logs_read() -> None:
    # The injector of spec.serverProgram Injected failed once (the kubelet restarts it) and now runs again.
    injector = {**running("i2", restarts=1, last="i1"), "name": "inject-server-program"}
    waiting = {"name": "dispatcher", "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
    status = {"initContainerStatuses": [injector], "containerStatuses": [waiting]}
    seen = record()
    reads = update(seen, {"metadata": pod("u1")["metadata"], "status": status}, gone=False)
    assert reads == [("inject-server-program", 1, False), ("inject-server-program", 0, True)]
    (found,) = problems([seen], [])
    assert "restarted {'inject-server-program': 1} (inject-server-program last: exit code 1 (Error)" in found


def test_only_the_frozen_nodes_pods_are_excused_not_their_replacements() -> None:
    # The dispatcher on the frozen node restarted after the thaw and its log could not be read; the
    # StatefulSet's replacement, the same name on another node, restarted too.
    frozen, replacement = record("u1"), record("u2")
    for seen, uid in ((frozen, "u1"), (replacement, "u2")):
        update(seen, pod(uid, running(f"{uid}-c2", restarts=1, last=f"{uid}-c1")), gone=False)
    frozen.unread.append("reading the log of dispatcher (instance 0) broke: ProtocolError")
    frozen.errors.append(LoggedError("dispatcher", 0, "E1125 10:00:00.000000 grpc: Failed to heartbeat"))
    declared = on_frozen_node("ns", {"u1": "svc-dispatcher-0"}, "its node was frozen")
    (found,) = problems([frozen, replacement], [declared])
    assert found.startswith("pod ns/svc-dispatcher-0 (dispatcher of svc):\n  restarted {'dispatcher': 1}"), found
    assert "ProtocolError" not in found and "heartbeat" not in found
    assert problems([frozen], [declared]) == []


def test_a_deleted_pod_and_its_replacement_are_no_restart() -> None:
    old, new = record("u1"), record("u2")
    update(old, pod("u1", running("c1"), deleting=True), gone=False)
    update(old, pod("u1", running("c1"), deleting=True), gone=True)
    update(new, pod("u2", running("c9")), gone=False)
    assert (old.deleting, old.gone) == (True, True)
    assert problems([old, new], []) == []


def test_a_restart_fails_unless_a_test_expected_it_for_that_pod() -> None:
    seen = record()
    update(seen, pod("u1", running("c2", restarts=1, last="c1")), gone=False)
    (found,) = problems([seen], [expect(pod="svc-worker-.*", restarts=True)])
    assert "restarted {'dispatcher': 1} (dispatcher last: exit code 1 (Error)" in found
    assert problems([seen], [expect(restarts=True)]) == []


def test_only_the_runtime_failing_to_freeze_a_new_containers_cgroup_is_not_a_restart() -> None:
    """runc failing to freeze the cgroup of a container it starts (a loaded node; the kubelet starts it
    again) is no restart of ours; any other StartError, or a second restart, still is."""

    def started_again(reason: str, message: str, restarts: int = 1) -> dict[str, Any]:
        status = running("c2", restarts=restarts)
        terminated = {"containerID": "c1", "exitCode": 128, "reason": reason, "message": message}
        status["lastState"] = {"terminated": terminated}
        return status

    freeze = (
        "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
        "failed: unable to start container process: error during container init: error setting cgroup config "
        "for procHooks process: unable to freeze"
    )
    seen = record()
    update(seen, pod("u1", started_again("StartError", freeze)), gone=False)
    assert problems([seen], []) == []
    twice = record()
    update(twice, pod("u1", started_again("StartError", freeze, restarts=2)), gone=False)
    (found,) = problems([twice], [])
    assert "restarted {'dispatcher': 1}" in found
    for reason, message in (
        ("StartError", 'exec: "tfdata-server": executable file not found in $PATH'),
        ("Error", freeze),
    ):
        other = record()
        update(other, pod("u1", started_again(reason, message)), gone=False)
        (found,) = problems([other], [])
        assert "restarted {'dispatcher': 1}" in found, (reason, message)


def test_an_error_line_fails_unless_the_expectation_matches_it() -> None:
    seen = record()
    seen.errors.append(LoggedError("dispatcher", 0, "10:00 ERROR tfdata-server: dispatcher failed to start: disk"))
    seen.errors.append(LoggedError("dispatcher", 0, "Traceback (most recent call last):\n  ...\nKeyError: 'x'"))
    (found,) = problems([seen], [expect(restarts=True, errors="failed to start: disk")])
    assert "KeyError" in found and "failed to start" not in found
    # Expecting restarts excuses no error line.
    assert len(problems([seen], [expect(restarts=True)])[0].splitlines()) > 3


def test_an_unread_log_fails() -> None:
    seen = record()
    seen.unread.append("the log of dispatcher could not be read: 404")
    (found,) = problems([seen], [expect(restarts=True, errors=".*")])
    assert "could not be read: 404" in found


def test_error_lines_in_each_programs_format() -> None:
    log = [
        "2026-11-25T10:40:47.634 INFO tfdata-server: health port listening on 0.0.0.0:8080",
        "2026-11-25T10:40:53.503 ERROR tfdata-server: dispatcher failed to start: /j; Read-only file system",
        "I0000 00:00:1795603248.075406      13 port.cc:153] oneDNN custom operations are on.",
        "E0000 00:00:1795603248.075406      13 grpc_util.cc:75] Failed to heartbeat",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "[2026-11-25 10:40:35,811] kopf.objects         [ERROR   ] Handler 'x' failed with an exception.",
        '{"message": "Created Service x", "timestamp": "2026-11-25T10:40:37", "severity": "info"}',
        '{"message": "Request attempt #1/9 failed; will retry", "severity": "error"}',
        '{"message": "Handler failed", "severity": "warning", "exc_info": "Traceback (most recent call last):\\n"}',
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: bad",
        "2026-11-25T10:40:53.672 INFO tfdata-server: health probes stopped",
    ]
    found = list(error_lines(log))
    assert found == [log[1], log[3], log[5], log[7], log[8], "\n".join(log[9:12])]
