"""Why a StatefulSet does not serve, from cached pods and its Events: one table of what Kubernetes
reports (the messages are the ones its controllers, scheduler and kubelet write) and what the
conditions then say."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.api import spec
from tfdata_operator.plan import diagnose, hold, status
from tfdata_operator.plan.diagnose import Finding
from tfdata_operator.render.builders import BuildSettings

Manifest = dict[str, Any]
STS_UID = "sts-uid"


def sts(name: str = "demo-worker", replicas: int = 2, pods: int = 0, observed: bool = True, claim: bool = False
        ) -> Manifest:  # fmt: skip
    body: Manifest = {
        "kind": "StatefulSet",
        "metadata": {"name": name, "uid": STS_UID, "generation": 3},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": 3 if observed else 2, "replicas": pods, "readyReplicas": 0,
                   "currentRevision": "r1", "updateRevision": "r1"},
    }  # fmt: skip
    if claim:
        body["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "journal"}}]
    return body


OLD_TF = (
    "tfdata-server: this image has TensorFlow 2.12.0; the server program needs TensorFlow 2.16 or newer: "
    "use an image with a newer TensorFlow as spec.image"
)
NO_PYTHON = 'failed to create containerd task: exec: "python3": executable file not found in $PATH: unknown'


def pod(name: str = "demo-worker-0", conditions: list[Manifest] | None = None, **container: Any) -> Manifest:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "ownerReferences": [{"uid": STS_UID}]},
        "status": {
            "phase": "Pending",
            "conditions": conditions or [],
            "containerStatuses": [{"name": "server", "ready": False, **container}] if container else [],
        },
    }


def unschedulable(message: str) -> list[Manifest]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]


def event(reason: str, message: str, when: str = "2026-11-23T20:00:00Z", uid: str = STS_UID, **extra: Any
          ) -> Manifest:  # fmt: skip
    return {"type": "Warning", "reason": reason, "message": message, "lastTimestamp": when,
            "involvedObject": {"uid": uid}, **extra}  # fmt: skip


PRIORITY = (
    'create Pod demo-worker-0 in StatefulSet demo-worker failed error: pods "demo-worker-0" is forbidden: '
    "no PriorityClass with name does-not-exist was found"
)
QUOTA = (
    'create Pod demo-worker-1 in StatefulSet demo-worker failed error: pods "demo-worker-1" is forbidden: '
    "exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1"
)
ADMISSION = (
    'create Pod demo-worker-0 in StatefulSet demo-worker failed error: pods "demo-worker-0" is forbidden: '
    'violates PodSecurity "restricted:latest": runAsNonRoot != true'
)
CLAIM = (
    "create Claim journal-demo-dispatcher-0 for Pod demo-dispatcher-0 in StatefulSet demo-dispatcher failed "
    'error: persistentvolumeclaims "journal-demo-dispatcher-0" is forbidden: exceeded quota: storage'
)
UNSCHEDULABLE = (
    "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are "
    "available: 1 Preemption is not helpful for scheduling."
)
UNBOUND = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: ..."
CRASH = "back-off 40s restarting failed container=server pod=demo-worker-0_ml(uid)"
PULL = 'Back-off pulling image "nope.invalid/tfdata-server:1": ErrImagePull: failed to resolve reference'

CASES = [
    pytest.param(sts(), [], [event("FailedCreate", PRIORITY)], {},
                 Finding("FailedCreate", "StatefulSet demo-worker cannot create pod demo-worker-0: "
                         'pods "demo-worker-0" is forbidden: no PriorityClass with name does-not-exist was found'),
                 id="missing-priority-class"),
    pytest.param(sts(pods=1), [pod()], [event("FailedCreate", QUOTA)], {},
                 Finding("FailedCreate", "StatefulSet demo-worker cannot create pod demo-worker-1: "
                         'pods "demo-worker-1" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=1, '
                         "limited: pods=1"),
                 id="quota-exceeded"),
    pytest.param(sts(), [], [event("FailedCreate", ADMISSION)], {},
                 Finding("FailedCreate", "StatefulSet demo-worker cannot create pod demo-worker-0: "
                         'pods "demo-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
                         "runAsNonRoot != true"),
                 id="admission-refused"),
    pytest.param(sts("demo-dispatcher", 1, claim=True), [], [event("FailedCreate", CLAIM)], {},
                 Finding("FailedCreate", "StatefulSet demo-dispatcher cannot create claim journal-demo-dispatcher-0: "
                         'persistentvolumeclaims "journal-demo-dispatcher-0" is forbidden: exceeded quota: storage'),
                 id="claim-refused"),
    pytest.param(sts(), [], [event("FailedCreate", "something new")], {},
                 Finding("FailedCreate", "StatefulSet demo-worker cannot create its pods: something new"),
                 id="failed-create-in-other-words"),
    pytest.param(sts(), [],
                 [event("FailedCreate", QUOTA, "2026-11-23T20:05:00Z"), event("FailedCreate", PRIORITY),
                  event("FailedCreate", ADMISSION, uid="earlier-statefulset", lastTimestamp="2026-11-23T21:00:00Z")],
                 {}, Finding("FailedCreate", 'StatefulSet demo-worker cannot create pod demo-worker-1: pods '
                             '"demo-worker-1" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=1, '
                             "limited: pods=1"),
                 id="the-newest-failure-of-this-statefulset"),
    pytest.param(sts(), [], [event("SuccessfulCreate", "create Pod ... successful", type="Normal")], {}, None,
                 id="no-failure-no-finding"),
    pytest.param(sts(pods=2), [pod(conditions=unschedulable(UNSCHEDULABLE)),
                               pod("demo-worker-1", conditions=unschedulable(UNSCHEDULABLE))], [], {},
                 Finding("Unschedulable", f"Pod demo-worker-0 (and 1 more pod) cannot be scheduled: {UNSCHEDULABLE}"),
                 id="unschedulable"),
    pytest.param(sts("demo-dispatcher", 1, 1, claim=True),
                 [pod("demo-dispatcher-0", conditions=unschedulable(UNBOUND))], [],
                 {"journal-demo-dispatcher-0": [event("ProvisioningFailed",
                                                      'storageclass.storage.k8s.io "nope" not found')]},
                 Finding("ProvisioningFailed", "The claim journal-demo-dispatcher-0 is not bound: "
                         'storageclass.storage.k8s.io "nope" not found'),
                 id="claim-not-provisioned"),
    pytest.param(sts("demo-dispatcher", 1, 1, claim=True),
                 [pod("demo-dispatcher-0", conditions=unschedulable(UNBOUND))], [],
                 {"journal-demo-dispatcher-0": []},
                 Finding("ClaimPending", "The claim journal-demo-dispatcher-0 is not bound yet: Pod demo-dispatcher-0 "
                         f"cannot be scheduled: {UNBOUND}"),
                 id="claim-pending-without-events"),
    pytest.param(sts(pods=2), [pod(state={"waiting": {"reason": "CrashLoopBackOff", "message": CRASH}},
                                   lastState={"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}),
                               pod("demo-worker-1", state={"running": {}}, ready=True)], [], {},
                 Finding("CrashLoopBackOff", f"Pod demo-worker-0: container server is in CrashLoopBackOff: {CRASH}; "
                         "it last exited with code 1 (Error): boom"),
                 id="crash-loop"),
    pytest.param(sts(pods=1, replicas=1), [pod(state={"waiting": {"reason": "ImagePullBackOff", "message": PULL}})],
                 [], {},
                 Finding("ImagePullBackOff", f"Pod demo-worker-0: container server is in ImagePullBackOff: {PULL}"),
                 id="image-pull-back-off"),
    pytest.param(sts(pods=1, replicas=1), [pod(state={"waiting": {"reason": "ErrImagePull"}})], [], {},
                 Finding("ErrImagePull", "Pod demo-worker-0: container server is in ErrImagePull"),
                 id="err-image-pull"),
    pytest.param(sts(pods=1, replicas=1), [pod(state={"waiting": {"reason": "ContainerCreating"}})], [], {}, None,
                 id="starting-is-not-a-problem"),
    pytest.param(sts(pods=1, replicas=1), [pod(state={"running": {}})], [], {}, None, id="running-not-ready-yet"),
    pytest.param(None, [], [], {}, None, id="no-statefulset"),
    pytest.param(sts(pods=1, replicas=1),
                 [pod(image="mine:1", state={"waiting": {"reason": "CrashLoopBackOff", "message": CRASH}},
                      lastState={"terminated": {"exitCode": 3, "reason": "Error", "message": OLD_TF}})], [], {},
                 Finding("UnsupportedImage",
                         f"Pod demo-worker-0: container server (image mine:1) cannot serve: {OLD_TF}"),
                 id="tensorflow-too-old"),
    pytest.param(sts(pods=1, replicas=1),
                 [pod(image="busybox", state={"waiting": {"reason": "CrashLoopBackOff", "message": CRASH}},
                      lastState={"terminated": {"exitCode": 128, "reason": "StartError", "message": NO_PYTHON}})],
                 [], {},
                 Finding("UnsupportedImage", "Pod demo-worker-0: container server (image busybox) has no python3 on "
                         "its PATH: spec.image must have Python 3.10 or newer and TensorFlow 2.16 or newer (or provide "
                         "tfdata-server, with spec.serverProgram FromImage)"),
                 id="no-python"),
    pytest.param(sts(pods=1, replicas=1),
                 [{**pod(), "status": {"phase": "Pending", "initContainerStatuses": [
                     {"name": "inject-server-program", "state": {"waiting": {"reason": "ImagePullBackOff",
                                                                            "message": PULL}}}]}}], [], {},
                 Finding("ImagePullBackOff",
                         f"Pod demo-worker-0: container inject-server-program is in ImagePullBackOff: {PULL}"),
                 id="injector-cannot-be-pulled"),
]  # fmt: skip


@pytest.mark.parametrize(("statefulset", "pods", "events", "claims", "expected"), CASES)
def test_explain(
    statefulset: Manifest | None,
    pods: list[Manifest],
    events: list[Manifest],
    claims: dict[str, list[Manifest]],
    expected: Finding | None,
) -> None:
    assert diagnose.explain(statefulset, pods, events, claims) == expected


def test_pods_being_deleted_or_of_another_statefulset_are_not_blamed() -> None:
    gone = pod(state={"waiting": {"reason": "CrashLoopBackOff"}})
    gone["metadata"]["deletionTimestamp"] = "t"
    other = pod("demo-worker-1", state={"waiting": {"reason": "ImagePullBackOff"}})
    other["metadata"]["ownerReferences"] = [{"uid": "an-earlier-statefulset"}]
    assert diagnose.explain(sts(pods=2), [gone, other]) is None


def test_a_long_message_is_cut() -> None:
    found = diagnose.explain(sts(pods=1, replicas=1), [pod(conditions=unschedulable("x" * 5000))])
    assert found is not None and len(found.message) < diagnose.MAX_QUOTED + 100 and found.message.endswith("x…")


def test_terminal_escapes_and_control_characters_of_a_termination_message_are_not_quoted() -> None:
    # A server's last words, as its log had them: colours and a clear-screen reach `kubectl describe` otherwise.
    said = "\x1b[31mTraceback\x1b[0m\r\n\x1b[2J  boom\x00\x9b"
    crashed = pod(
        state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
        lastState={"terminated": {"exitCode": 1, "reason": "Error", "message": said}},
    )
    found = diagnose.explain(sts(pods=1, replicas=1), [crashed])
    assert found is not None and found.message.endswith("it last exited with code 1 (Error): Traceback boom")


@pytest.mark.parametrize(
    ("statefulset", "pods", "expected"),
    [
        pytest.param(sts(pods=0), [], True, id="no-pod-created"),
        pytest.param(sts(pods=1), [pod()], True, id="one-missing"),
        pytest.param(sts(pods=2), [pod(), pod("demo-worker-1")], False, id="all-created"),
        pytest.param(sts(pods=0, observed=False), [], False, id="controller-has-not-seen-the-spec"),
        pytest.param(sts(pods=2), [], False, id="the-cache-lags-the-statefulset"),
        pytest.param(None, [], False, id="no-statefulset"),
    ],
)
def test_events_are_read_only_for_pods_a_statefulset_could_not_create(
    statefulset: Manifest | None, pods: list[Manifest], expected: bool
) -> None:
    assert diagnose.needs_events(statefulset, pods) is expected


def test_claims_are_read_only_for_pods_the_scheduler_holds_for_them() -> None:
    dispatcher = sts("demo-dispatcher", 1, 1, claim=True)
    assert diagnose.claims_to_read(dispatcher, [pod("demo-dispatcher-0", unschedulable(UNBOUND))]) == [
        "journal-demo-dispatcher-0"
    ]
    assert diagnose.claims_to_read(dispatcher, [pod("demo-dispatcher-0", unschedulable(UNSCHEDULABLE))]) == []
    assert diagnose.claims_to_read(dispatcher, [pod("demo-dispatcher-0")]) == []


# --- What the conditions say --------------------------------------------------------------------


def conditions(observed: status.Servers) -> dict[str, dict[str, Any]]:
    body = {"metadata": {"name": "demo", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 2}}}  # fmt: skip
    svc = spec.parse(body, "img")
    st = status.compute_status(svc, body, observed, BuildSettings(), "2026-11-23T20:00:00Z")
    return {c["type"]: c for c in st["conditions"]}


def test_the_conditions_carry_the_childs_reason_and_message() -> None:
    failed = Finding("FailedCreate", "StatefulSet demo-worker cannot create pod demo-worker-0: no PriorityClass")
    waiting = Finding("ImagePullBackOff", "Pod demo-dispatcher-0: container server is in ImagePullBackOff")
    by_type = conditions(
        status.Servers(sts("demo-dispatcher", 1, 1), sts(), dispatcher_problem=waiting, workers_problem=failed)
    )
    assert by_type["WorkersReady"]["reason"] == "FailedCreate"
    assert by_type["WorkersReady"]["message"] == f"0/2 workers are ready and up to date: {failed.message}"
    assert by_type["DispatcherReady"]["reason"] == "ImagePullBackOff"
    assert by_type["DispatcherReady"]["message"] == f"The dispatcher is not ready: {waiting.message}"
    # Ready names the dispatcher's problem first: without it, no worker can serve anything.
    assert (by_type["Ready"]["reason"], by_type["Ready"]["message"]) == (
        "ImagePullBackOff",
        by_type["DispatcherReady"]["message"],
    )


def test_a_problem_never_overrides_a_ready_or_missing_statefulset() -> None:
    found = Finding("Unschedulable", "Pod x cannot be scheduled")
    by_type = conditions(status.Servers(None, None, dispatcher_problem=found, workers_problem=found))
    assert by_type["DispatcherReady"]["reason"] == "DispatcherMissing"
    assert by_type["WorkersReady"]["reason"] == "WorkersMissing"


# --- A server's own readiness detail ------------------------------------------------------------


def running_pod(name: str, ready: bool = False, ip: str | None = "10.0.0.7") -> Manifest:
    body = pod(name, [{"type": "Ready", "status": "True" if ready else "False"}], state={"running": {}})
    if ip:
        body["status"]["podIP"] = ip
    return body


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([running_pod("demo-worker-0")], "demo-worker-0", id="running-not-ready"),
        pytest.param([running_pod("demo-worker-0", ready=True), running_pod("demo-worker-1")], "demo-worker-1",
                     id="the-unready-one"),
        pytest.param([running_pod("demo-worker-0", ready=True)], None, id="ready"),
        pytest.param([running_pod("demo-worker-0", ip=None)], None, id="no-address-to-ask"),
        pytest.param([pod(state={"waiting": {"reason": "ContainerCreating"}})], None, id="not-started"),
    ],
)  # fmt: skip
def test_the_server_asked_is_one_that_runs_but_is_not_ready(pods: list[Manifest], expected: str | None) -> None:
    found = diagnose.unready_server(sts(pods=len(pods)), pods)
    assert (found["metadata"]["name"] if found else None) == expected


def test_a_readiness_detail_becomes_the_finding() -> None:
    detail = "not ok: running: dispatcher serving on port 5050; 2 of 3 workers registered: waiting for every listed "
    found = diagnose.from_readiness(running_pod("demo-dispatcher-0"), detail + "worker to register")
    assert found == Finding(
        "ServerNotReady",
        "Pod demo-dispatcher-0 runs but is not ready: running: dispatcher serving on port 5050; 2 of 3 workers "
        "registered: waiting for every listed worker to register",
    )


def test_a_held_rescale_is_reported_rather_than_a_workers_problem() -> None:
    """A held change is the operator's own decision: it names it, whatever else keeps workers unready."""
    body = {"metadata": {"name": "demo", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {"shardingPolicy": "FILE", "workers": {"replicas": 3}}}  # fmt: skip
    held = hold.HoldDecision(hold.HOLD, hold.Pending("workers 2→3", "worker count change 2→3", 2), "waits: reading")
    problem = Finding("CrashLoopBackOff", "Pod demo-worker-0: container worker is in CrashLoopBackOff")
    observed = status.Servers(sts("demo-dispatcher", 1, 1), sts(), workers_problem=problem)
    st = status.compute_status(spec.parse(body, "img"), body, observed, BuildSettings(), "T1", decision=held)
    workers = next(c for c in st["conditions"] if c["type"] == "WorkersReady")
    assert (workers["reason"], workers["message"]) == ("RescaleHeld", "waits: reading")
