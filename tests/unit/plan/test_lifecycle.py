"""spec.lifecycle: when a service suspends or deletes itself after its workload finishes, goes with
it, or sleeps when nobody reads (plan/lifecycle.py), and what the reconcile sends for it
(controller/lifecycle.py's follow_lifecycle)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import reasons, spec
from tfdata_operator.controller import reconcile
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Outcome
from tfdata_operator.plan import children, lifecycle

from fixtures.cases import parse
from fixtures.fakes import FakeApi, service
from fixtures.support import service_signals

Manifest = dict[str, Any]
NOW = datetime(2026, 11, 28, 10, 0, 0, tzinfo=timezone.utc)
CONFIG = OperatorConfig(server_image="tfdata-server:test")
JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train"}


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(condition: str | None = None, ago: float = 0, uid: str = "job-uid", kind: str = "Job") -> Manifest:
    conditions = [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": stamp(ago + 1)}]
    if condition:
        conditions.append({"type": condition, "status": "True", "lastTransitionTime": stamp(ago)})
    api_version = "batch/v1" if kind == "Job" else "jobset.x-k8s.io/v1alpha2"
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "train", "uid": uid},
        "status": {"conditions": conditions},
    }


def svc(suspend: bool = False, **life: Any) -> spec.ServiceSpec:
    return parse(suspend=suspend, lifecycle=life)


def test_which_conditions_mean_finished() -> None:
    assert lifecycle.finished(job()) is None  # SuccessCriteriaMet alone: the Job still has pods
    for kind in ("Complete", "Completed", "Succeeded", "Failed", "Finished"):
        found = lifecycle.finished(job(kind, ago=30))
        assert found is not None and found[0] == kind and found[1] == NOW - timedelta(seconds=30)
    unfinished = {"status": {"conditions": [{"type": "Complete", "status": "False"}]}}
    assert lifecycle.finished(unfinished) is None


def test_a_running_job_is_checked_again_and_nothing_is_planned() -> None:
    d = lifecycle.decide(svc(workload=JOB, afterWorkloadFinishes={}), job(), [], None, None, NOW)
    assert d.action is None and d.status == {"workload": {**JOB, "uid": "job-uid", "state": "Running"}}
    assert d.requeue_after == lifecycle.WORKLOAD_RECHECK_SECONDS and d.events == []


def test_a_finished_job_plans_the_suspend_says_when_once_then_carries_it_out() -> None:
    s = svc(workload=JOB, afterWorkloadFinishes={"afterSeconds": 60})
    first = lifecycle.decide(s, job("Complete", ago=20), [], None, None, NOW)
    assert first.action is None
    assert first.status is not None
    assert first.status["nextAction"] == {"action": "Suspend", "why": "WorkloadFinished", "at": stamp(-40)}
    assert first.requeue_after == 40
    assert [(r, m) for _, r, m in first.events] == [
        (reasons.WORKLOAD_FINISHED, f"Job train finished (Complete): the service will be suspended at {stamp(-40)}")
    ]
    again = lifecycle.decide(s, job("Complete", ago=30), [], first.status, None, NOW)
    assert again.events == [] and again.action is None
    due = lifecycle.decide(s, job("Complete", ago=61), [], first.status, None, NOW)
    assert due.action == "Suspend" and due.status is not None and due.status["workload"]["actedAt"] == stamp(0)
    assert due.events[0][1] == reasons.LIFECYCLE_SUSPEND and "afterSeconds 60" in due.events[0][2]


def test_the_action_is_carried_out_once_per_workload() -> None:
    """A service resumed by hand after its Job finished stays resumed; a new Job of the same name counts anew."""
    s = svc(workload=JOB, afterWorkloadFinishes={})
    done = lifecycle.decide(s, job("Failed", ago=5), [], None, None, NOW).status
    assert done is not None and done["workload"]["actedAt"]
    assert lifecycle.decide(s, job("Failed", ago=100), [], done, None, NOW).action is None
    rerun = lifecycle.decide(s, job("Complete", ago=1, uid="new-uid"), [], done, None, NOW)
    assert rerun.action == "Suspend"


def test_delete_after_the_workload_finishes() -> None:
    s = svc(workload=JOB, afterWorkloadFinishes={"action": "Delete"})
    d = lifecycle.decide(s, job("Complete", ago=0), [], None, None, NOW)
    assert d.action == "Delete" and d.events[-1][1] == reasons.LIFECYCLE_DELETE
    # Delete goes ahead on a suspended service too; a suspend of a suspended one does nothing.
    assert lifecycle.decide(svc(True, **s_life(s)), job("Complete"), [], None, None, NOW).action == "Delete"
    suspended = svc(True, workload=JOB, afterWorkloadFinishes={})
    assert lifecycle.decide(suspended, job("Complete"), [], None, None, NOW).action is None


def s_life(s: spec.ServiceSpec) -> dict[str, Any]:
    after = s.lifecycle.after_workload_finishes
    assert after is not None
    return {"workload": JOB, "afterWorkloadFinishes": {"action": after.action}}


def test_a_missing_or_unreadable_workload_is_said_once_and_nothing_is_done() -> None:
    s = svc(workload=JOB, afterWorkloadFinishes={"action": "Delete"}, deleteWithWorkload=True)
    missing = lifecycle.decide(s, None, [], None, None, NOW)
    assert missing.action is None and missing.owner_references is None
    assert missing.status is not None and missing.status["workload"]["state"] == "NotFound"
    assert [(t, r) for t, r, _ in missing.events] == [("Warning", reasons.WORKLOAD_NOT_FOUND)]
    assert lifecycle.decide(s, None, [], missing.status, None, NOW).events == []
    refused = lifecycle.decide(s, lifecycle.Unreadable("jobs.batch is forbidden"), [], None, None, NOW)
    assert refused.action is None and refused.status is not None
    assert refused.status["workload"]["state"] == "Unreadable"
    assert refused.events[0][:2] == ("Warning", reasons.WORKLOAD_UNREADABLE)


def test_delete_with_workload_adds_one_owner_reference_and_removes_it_when_turned_off() -> None:
    s = svc(workload=JOB, deleteWithWorkload=True)
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keep", "uid": "cm"}
    d = lifecycle.decide(s, job(), [other], None, None, NOW)
    ours = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid"}
    assert d.owner_references == [other, ours]
    # No blockOwnerDeletion: the Job's deletion never waits for the service, and it needs no permission.
    assert "blockOwnerDeletion" not in ours and "controller" not in ours
    assert lifecycle.decide(s, job(), [other, ours], d.status, None, NOW).owner_references is None
    off = lifecycle.decide(svc(workload=JOB), job(), [other, ours], d.status, None, NOW)
    assert off.owner_references == [other]
    gone = lifecycle.decide(parse(), None, [other, ours], d.status, None, NOW)
    assert gone.owner_references == [other] and gone.status is None


def test_idle_suspends_after_the_time_without_a_reader() -> None:
    s = svc(idle={"suspendAfterSeconds": 120})
    assert lifecycle.needs_signal(s, True, None, NOW)
    assert not lifecycle.needs_signal(s, False, None, NOW)  # no dispatcher: nothing to ask
    reading = lifecycle.decide(s, None, [], None, service_signals(True), NOW)
    assert reading.action is None and reading.status is not None
    assert reading.status["lastReadTime"] == stamp(0) and reading.status["secondsSinceLastRead"] == 0
    assert reading.status["nextAction"] == {"action": "Suspend", "why": "Idle", "at": stamp(-120)}
    assert reading.requeue_after == 120
    # Not read again before the planned time: one read per suspendAfterSeconds at most.
    assert not lifecycle.needs_signal(s, True, reading.status, NOW + timedelta(seconds=60))
    quiet = lifecycle.decide(s, None, [], reading.status, None, NOW + timedelta(seconds=60))
    assert quiet.status is not None and quiet.status["nextAction"] == reading.status["nextAction"]
    assert quiet.status["secondsSinceLastRead"] == 60
    assert lifecycle.needs_signal(s, True, reading.status, NOW + timedelta(seconds=120))
    later = NOW + timedelta(seconds=121)
    idle = lifecycle.decide(s, None, [], reading.status, service_signals(False, idle_seconds=121), later)
    assert idle.action == "Suspend" and "No client has read for 121 s" in idle.message
    assert idle.events[0][1] == reasons.LIFECYCLE_SUSPEND


def test_a_reader_moves_the_idle_suspend_and_an_unknown_answer_never_suspends() -> None:
    s = svc(idle={"suspendAfterSeconds": 60})
    old = {"lastReadTime": stamp(100), "nextAction": {"action": "Suspend", "why": "Idle", "at": stamp(40)}}
    moved = lifecycle.decide(s, None, [], old, service_signals(False, idle_seconds=10), NOW)
    assert moved.action is None and moved.status is not None
    assert moved.status["lastReadTime"] == stamp(10) and moved.status["nextAction"]["at"] == stamp(-50)
    unknown = lifecycle.decide(s, None, [], old, "connection refused", NOW)
    assert unknown.action is None and unknown.status is not None
    assert unknown.status["readError"] == "connection refused"
    assert unknown.requeue_after == lifecycle.WORKLOAD_RECHECK_SECONDS


def test_a_suspended_service_keeps_its_last_read_and_plans_nothing() -> None:
    s = svc(True, idle={"suspendAfterSeconds": 60})
    old = {"lastReadTime": stamp(100), "nextAction": {"action": "Suspend", "why": "Idle", "at": stamp(40)}}
    assert not lifecycle.needs_signal(s, True, old, NOW)
    d = lifecycle.decide(s, None, [], old, None, NOW)
    assert d.action is None and d.status == {"lastReadTime": stamp(100), "secondsSinceLastRead": 100}
    assert d.requeue_after is None


@pytest.mark.parametrize(
    ("kind", "plural"),
    [("Job", "jobs"), ("JobSet", "jobsets"), ("TrainJob", "trainjobs"), ("Policy", "policies"), ("Mesh", "meshes")],
)
def test_workload_paths(kind: str, plural: str) -> None:
    assert children.path("x.io/v1", kind, "ml", "train") == f"/apis/x.io/v1/namespaces/ml/{plural}/train"


# --- the reconcile step ----------------------------------------------------------------------------


def run(api: FakeApi, body: Manifest) -> Outcome:
    return reconcile.reconcile(api, CONFIG, body, api.observed())


def with_job(api: FakeApi, manifest: Manifest) -> None:
    api.objects[("Job", "train")] = manifest


def test_the_reconcile_ties_the_service_to_its_job_and_suspends_it_when_the_job_completed() -> None:
    api = FakeApi()
    body = service(lifecycle={"workload": JOB, "afterWorkloadFinishes": {}, "deleteWithWorkload": True})
    with_job(api, job("Complete", ago=1))
    outcome = run(api, body)
    refs, suspend = api.patches
    assert refs["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid"}
    ]
    assert refs["metadata"]["resourceVersion"] == "1"  # refused if the service changed since it was read
    assert suspend == {"spec": {"suspend": True}}
    assert (reasons.LIFECYCLE_SUSPEND in {r for _, r, _ in api.events}) and outcome.result == "changed"
    assert api.status is not None and api.status["lifecycle"]["workload"]["actedAt"]
    # The same reconcile already builds the children suspended: no worker, no dispatcher pod.
    assert api.objects[("StatefulSet", "demo-worker")]["spec"]["replicas"] == 0


def test_the_reconcile_deletes_the_service_and_stops_there() -> None:
    api = FakeApi()
    body = service(lifecycle={"workload": JOB, "afterWorkloadFinishes": {"action": "Delete"}})
    with_job(api, job("Failed", ago=1))
    run(api, body)
    calls = api.take_calls()
    assert ("delete", "TFDataService/demo") in calls
    assert not [c for c in calls if c[0] == "apply"]  # nothing created for a service being deleted
    assert api.status is not None and api.status["lifecycle"]["workload"]["actedAt"]


def test_a_forbidden_workload_says_which_permission_to_grant() -> None:
    api = FakeApi()

    def forbidden(api_version: str, kind: str, namespace: str | None, name: str) -> Manifest | None:
        raise ApiException(status=403, reason="Forbidden")

    api.get = forbidden  # type: ignore[method-assign]
    body = service(lifecycle={"workload": {"apiVersion": "x.io/v1", "kind": "TrainJob", "name": "t"}})
    run(api, body)
    assert api.status is not None
    message = api.status["lifecycle"]["workload"]["message"]
    assert "get on trainjobs in API group x.io" in message
    assert [r for t, r, _ in api.events if t == "Warning"] == [reasons.WORKLOAD_UNREADABLE]
    assert api.patches == []
