"""The reconcile loop against an in-memory API door: which requests each path costs.

``FakeApi`` (tests/fixtures/fakes.py) keeps objects the way the API server would for what the loop reads back
(server-side apply merges, uids, resourceVersions, managedFields), and records every call.
The budgets pinned here are the operator-at-scale goals: an idle reconcile of a warm cache
costs nothing; a create costs one dry run and one apply per child, one Event and one status
write; refusals write only the status and one Warning.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tfdata_operator.controller import kube as kubemodule
from tfdata_operator.controller import reconcile
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Observed, Outcome
from tfdata_operator.controller.readers import BUSY_RETRY_SECONDS, SERVER_INFO_RETRY_SECONDS, Readers
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import drain, hold
from tfdata_operator.plan.snapshotdir import DirectoryClaim
from tfdata_operator.render import builders
from tfdata_operator.wire.serverinfo import GraphDefVersions, ServerInfo
from tfdata_operator.wire.signals import ServiceSignals
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsReport

from fixtures.cases import STALLED_SIGNALS
from fixtures.fakes import Clock, FakeApi, service
from fixtures.support import service_signals

CONFIG = OperatorConfig(server_image="tfdata-server:test")
Manifest = dict[str, Any]


def run(api: FakeApi, body: Manifest) -> Outcome:
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, api.observed())


CHILDREN = [
    "Service/demo-dispatcher",
    "Service/demo-dispatcher-pods",
    "Service/demo-worker",
    "ConfigMap/demo-client",
    "StatefulSet/demo-dispatcher",
    "StatefulSet/demo-worker",
    "PodDisruptionBudget/demo-worker",
    "NetworkPolicy/demo",
]


def test_a_create_costs_a_dry_run_and_an_apply_per_child_one_event_and_one_status_write() -> None:
    api = FakeApi()
    outcome = run(api, service())
    calls = api.take_calls()
    n = len(CHILDREN)
    dry_runs, applies, rest = calls[:n], calls[n : 2 * n], calls[2 * n :]
    # The dry runs (all before any apply) and the applies after the first go out at once: their order varies.
    assert sorted(dry_runs) == sorted(("dry-run", c) for c in CHILDREN)
    assert applies[0] == ("apply", CHILDREN[0])
    assert sorted(applies) == sorted(("apply", c) for c in CHILDREN)
    assert rest == [("event", "Created"), ("status", "demo")]
    assert outcome.result == "changed"
    assert api.events == [
        (
            "Normal",
            "Created",
            "Created " + ", ".join(c.replace("/", " ") for c in CHILDREN),
        )
    ]


def test_an_idle_reconcile_of_a_warm_cache_sends_no_request() -> None:
    api = FakeApi()
    run(api, service())
    api.take_calls()
    outcome = run(api, service())
    assert api.take_calls() == []
    assert outcome.result == "idle" and outcome.written == []


def test_a_scale_is_one_dry_run_one_apply_and_a_scaled_event() -> None:
    api = FakeApi()
    run(api, service())
    api.take_calls()
    run(api, service(workers={"replicas": 3}))
    calls = api.take_calls()
    assert calls[:2] == [
        ("dry-run", "StatefulSet/demo-worker"),
        ("apply", "StatefulSet/demo-worker"),
    ]
    assert ("event", "Scaled") in calls
    assert any("from 2 to 3 replicas" in message for _, _, message in api.events)


def test_an_invalid_spec_writes_the_status_and_one_warning_then_nothing() -> None:
    api = FakeApi()
    body = service(shardingPolicy="SIDEWAYS")
    outcome = run(api, body)
    assert api.take_calls() == [("event", "InvalidSpec"), ("status", "demo")]
    assert outcome.result == "invalid"
    ready = next(c for c in api.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec" and "SIDEWAYS" in ready["message"]
    run(api, body)
    assert api.take_calls() == []


HOME = {
    "volumes": [{"name": "home", "hostPath": {"path": "/home"}}],
    "volumeMounts": [{"name": "home", "mountPath": "/d"}],
}


def test_a_host_path_edit_is_refused_and_changes_nothing_unless_the_operator_allows_it() -> None:
    api = FakeApi()
    run(api, service())
    api.take_calls()
    before = api.observed().objects
    outcome = run(api, service(workers={"replicas": 2, **HOME}))
    assert api.take_calls() == [("event", "InvalidSpec"), ("status", "demo")]
    assert outcome.result == "invalid" and api.observed().objects == before
    ready = next(c for c in api.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]
    assert ready["reason"] == "InvalidSpec" and "--allow-host-path-volumes" in ready["message"]

    allowing = dataclasses.replace(CONFIG, allow_host_path=True)
    reconcile.reconcile(
        api, allowing, {**service(workers={"replicas": 2, **HOME}), "status": api.status}, api.observed()
    )
    assert ("apply", "StatefulSet/demo-worker") in api.take_calls()


def test_a_name_taken_in_the_cache_by_an_object_the_service_does_not_own_changes_nothing() -> None:
    api = FakeApi()
    foreign = {
        "kind": "Service",
        "metadata": {"name": "demo-worker", "namespace": "ml", "ownerReferences": []},
    }
    api.objects[("Service", "demo-worker")] = foreign
    outcome = run(api, service())
    assert api.take_calls() == [("event", "NameConflict"), ("status", "demo")]
    assert outcome.result == "conflict"
    assert api.objects == {("Service", "demo-worker"): foreign}


def test_a_name_taken_by_an_object_outside_the_cache_is_found_by_the_dry_run() -> None:
    class Taken(FakeApi):
        def apply(self, manifest: Manifest, dry_run: bool = False) -> Manifest:
            result = super().apply(manifest, dry_run)
            if plan.key(manifest) == ("StatefulSet", "demo-worker"):
                result["metadata"]["managedFields"].append({"manager": "kubectl-create", "operation": "Update"})
            return result

    api = Taken()
    outcome = run(api, service())
    calls = api.take_calls()
    assert all(verb != "apply" for verb, _ in calls), calls
    assert calls[-2:] == [("event", "NameConflict"), ("status", "demo")]
    assert outcome.result == "conflict"
    assert "StatefulSet demo-worker already exist" in api.events[-1][2]


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (
            422,
            'StatefulSet.apps "demo-worker" is invalid: spec.template.spec.priorityClassName: Invalid value',
        ),
        (
            500,
            "failed to create typed patch object (ml/demo-worker; apps/v1, Kind=StatefulSet): .spec: expected map",
        ),
        (403, 'statefulsets.apps "demo-worker" is forbidden: exceeded quota'),
    ],
)
def test_a_child_the_api_server_refuses_changes_nothing_and_says_why(status: int, message: str) -> None:
    api = FakeApi()
    api.refuse[("StatefulSet", "demo-worker")] = ApiException(
        status=status, reason="x", body=json.dumps({"message": message})
    )
    outcome = run(api, service())
    calls = api.take_calls()
    assert all(verb != "apply" for verb, _ in calls), calls
    assert calls[-2:] == [("event", "InvalidSpec"), ("status", "demo")]
    assert outcome.result == "invalid"
    assert message in api.events[-1][2] and api.objects == {}
    run(api, service())
    # The Warning once, the status unchanged: only reads again.
    assert [c for c in api.take_calls() if c[0] not in ("dry-run", "find")] == []


def test_a_refusal_too_long_for_the_status_warns_once_and_writes_the_status_once() -> None:
    # The API server's validation of a child with many errors: many lines, more than a condition's message holds.
    message = 'StatefulSet.apps "demo-worker" is invalid:\n' + "- a rule was broken\n" * 2_000
    api = FakeApi()
    api.refuse[("StatefulSet", "demo-worker")] = ApiException(status=422, body=json.dumps({"message": message}))
    run(api, service())
    assert [c for c in api.take_calls() if c[0] in ("event", "status")] == [
        ("event", "InvalidSpec"),
        ("status", "demo"),
    ]
    ready = next(c for c in api.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]
    assert "is invalid: - a rule was broken - a rule" in ready["message"]
    assert len(ready["message"]) <= 32768 and ready["message"].endswith("…")
    run(api, service())
    # What was written is what the next reconcile computes: no second Warning, no second write.
    assert [c for c in api.take_calls() if c[0] not in ("dry-run", "find")] == []


# The answer kube-apiserver 1.34.4 sends when a ValidatingAdmissionPolicy refuses the worker StatefulSet's scale
# (tests/unit/plan/test_admission.py has it whole, and the webhook's).
POLICY_SAYS = "the number of replicas is fixed in this namespace"
POLICY_DENIED = {
    "kind": "Status",
    "status": "Failure",
    "message": "statefulsets.apps \"demo-worker\" is forbidden: ValidatingAdmissionPolicy 'fixed' with binding "
    f"'fixed-ml' denied request: {POLICY_SAYS}",
    "reason": "Invalid",
    "code": 422,
}


def denied_by_policy() -> ApiException:
    return ApiException(status=422, reason="Unprocessable Entity", body=json.dumps(POLICY_DENIED))


def ready_condition(api: FakeApi) -> dict[str, Any]:
    return next(c for c in api.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]


def test_a_child_refused_by_admission_is_said_so_once_changes_nothing_and_is_retried() -> None:
    api = FakeApi()
    run(api, service())
    api.take_calls()
    before = copy.deepcopy(api.objects)
    api.refuse[("StatefulSet", "demo-worker")] = denied_by_policy()
    outcome = run(api, service(workers={"replicas": 3}))
    assert api.take_calls() == [
        ("dry-run", "StatefulSet/demo-worker"),
        ("event", "ChildRefusedByAdmission"),
        ("status", "demo"),
    ]
    # Retried with the queue's back-off (not a spec error that waits for the next edit), nothing changed.
    assert outcome.retry and outcome.result == "refused"
    assert api.objects == before
    ready = ready_condition(api)
    assert (ready["status"], ready["reason"]) == ("False", "ChildRefusedByAdmission")
    assert "refused the StatefulSet demo-worker: ValidatingAdmissionPolicy 'fixed'" in ready["message"]
    assert POLICY_SAYS in ready["message"] and "cluster administrator" in ready["message"]
    assert api.events[-1] == ("Warning", "ChildRefusedByAdmission", ready["message"])
    # The retries say nothing new: no second Warning, no write.
    again = run(api, service(workers={"replicas": 3}))
    assert api.take_calls() == [("dry-run", "StatefulSet/demo-worker")] and again.retry
    # The policy gone, the next retry scales and the refusal is over.
    del api.refuse[("StatefulSet", "demo-worker")]
    done = run(api, service(workers={"replicas": 3}))
    assert not done.retry and api.objects[("StatefulSet", "demo-worker")]["spec"]["replicas"] == 3
    assert ready_condition(api)["reason"] != "ChildRefusedByAdmission"


def test_a_refusal_by_admission_is_never_taken_for_a_field_that_needs_a_recreation() -> None:
    # A webhook quoting the API server's own words for an immutable field: another controller refused, so
    # the StatefulSet is not deleted to be made anew.
    api = FakeApi()
    run(api, service())
    api.take_calls()
    said = (
        'admission webhook "v.example.com" denied the request: spec: Forbidden: updates to statefulset spec for '
        "fields other than 'replicas' are forbidden"
    )
    api.refuse[("StatefulSet", "demo-worker")] = ApiException(status=403, body=json.dumps({"message": said}))
    outcome = run(api, service(workers={"replicas": 3}))
    assert [c for c in api.take_calls() if c[0] == "delete"] == []
    assert outcome.retry and ("StatefulSet", "demo-worker") in api.objects


def test_kueues_label_on_the_refused_statefulset_names_kueues_fix() -> None:
    api = FakeApi()
    run(api, service())
    api.objects[("StatefulSet", "demo-worker")]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "default"
    said = (
        'admission webhook "vstatefulset.kb.io" denied the request: spec.replicas: Invalid value: 3: field is immutable'
    )
    api.refuse[("StatefulSet", "demo-worker")] = ApiException(status=403, body=json.dumps({"message": said}))
    run(api, service(workers={"replicas": 3}))
    message = ready_condition(api)["message"]
    assert said in message and "integrations.externalFrameworks" in message and "docs/training-runs.md" in message


def test_a_refusal_by_admission_after_the_dry_run_is_said_after_the_changes_that_were_made() -> None:
    # Two changes: the dry runs pass, then the worker StatefulSet's apply is refused (a policy created meanwhile).
    api = FakeApi()
    run(api, service())
    api.take_calls()
    api.refuse_apply[("StatefulSet", "demo-worker")] = denied_by_policy()
    outcome = run(api, service(workers={"replicas": 3}, dispatcher={"port": 5051}))
    calls = api.take_calls()
    assert ("apply", "StatefulSet/demo-dispatcher") in calls and ("apply", "StatefulSet/demo-worker") in calls
    assert calls[-2:] == [("event", "ChildRefusedByAdmission"), ("status", "demo")]
    assert outcome.retry and outcome.result == "refused"
    assert api.objects[("StatefulSet", "demo-worker")]["spec"]["replicas"] == 2
    assert "refused the StatefulSet demo-worker" in ready_condition(api)["message"]


def test_an_error_of_the_api_server_while_applying_is_still_raised_for_a_retry() -> None:
    api = FakeApi()
    run(api, service())
    api.refuse_apply[("StatefulSet", "demo-worker")] = ApiException(status=500, reason="Internal Server Error")
    with pytest.raises(ApiException):
        run(api, service(workers={"replicas": 3}))


def test_a_foreign_object_whose_merge_with_the_child_is_refused_is_a_name_conflict() -> None:
    # A Service someone else made, with an unnamed port: merged with the child's named ports the API
    # server refuses it ("ports must be named"); the name is taken, and that is what the user must hear.
    api = FakeApi()
    api.objects[("Service", "demo-worker")] = {"kind": "Service", "metadata": {"name": "demo-worker", "uid": "x"}}
    refusal = ApiException(status=422, body=json.dumps({"message": "spec.ports[0].name: Required value"}))
    api.refuse[("Service", "demo-worker")] = refusal
    outcome = run_without_cache(api, service())
    calls = api.take_calls()
    assert ("find", "Service/demo-worker") in calls and all(verb != "apply" for verb, _ in calls), calls
    assert outcome.result == "conflict" and "Service demo-worker already exist" in api.events[-1][2]


def run_without_cache(api: FakeApi, body: Manifest) -> Outcome:
    """As `run`, but the cache holds nothing: the objects exist only in the API server."""
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, Observed())


def test_a_transient_api_error_is_raised_for_a_retry() -> None:
    api = FakeApi()
    api.refuse[("Service", "demo-worker")] = ApiException(status=503, reason="Service Unavailable")
    with pytest.raises(ApiException):
        run(api, service())
    assert api.objects == {}


def test_a_namespace_being_deleted_is_told_apart_from_a_failure() -> None:
    # The API server's answer, as kube-apiserver 1.34 sends it, to a create in a terminating namespace.
    body = {
        "kind": "Status",
        "status": "Failure",
        "message": 'services "demo-worker" is forbidden: unable to create new content in namespace ml'
        " because it is being terminated",
        "reason": "Forbidden",
        "details": {"name": "demo-worker", "kind": "services", "causes": [{"reason": "NamespaceTerminating"}]},
        "code": 403,
    }
    api = FakeApi()
    api.refuse[("Service", "demo-worker")] = ApiException(status=403, reason="Forbidden")
    api.refuse[("Service", "demo-worker")].body = json.dumps(body)
    with pytest.raises(ApiException) as raised:
        run(api, service())
    assert kubemodule.namespace_terminating(raised.value)
    assert api.objects == {}
    other = ApiException(status=403, reason="Forbidden")
    other.body = json.dumps({**body, "details": {"causes": [{"reason": "FieldValueForbidden"}]}})
    assert not kubemodule.namespace_terminating(other)
    assert not kubemodule.namespace_terminating(ApiException(status=403, reason="Forbidden"))
    assert not kubemodule.namespace_terminating(ValueError("not an API answer"))


def test_a_field_kubernetes_cannot_update_recreates_the_statefulset() -> None:
    api = FakeApi()
    run(api, service())
    api.take_calls()
    immutable = "StatefulSet.apps is invalid: spec: Forbidden: updates to statefulset spec for fields other than x"
    api.refuse[("StatefulSet", "demo-worker")] = ApiException(status=422, body=f'{{"message": "{immutable}"}}')
    outcome = run(api, service(workers={"replicas": 3}))
    assert api.take_calls() == [
        ("dry-run", "StatefulSet/demo-worker"),
        ("delete", "StatefulSet/demo-worker"),
        ("event", "Recreating"),
    ]
    assert outcome.result == "changed" and ("StatefulSet", "demo-worker") not in api.objects


def test_a_deleted_child_is_recreated_and_only_it() -> None:
    api = FakeApi()
    run(api, service())
    api.take_calls()
    del api.objects[("NetworkPolicy", "demo")]
    run(api, service())
    assert api.take_calls() == [
        ("dry-run", "NetworkPolicy/demo"),
        ("apply", "NetworkPolicy/demo"),
        ("event", "Created"),
    ]


def test_a_service_being_deleted_is_left_to_the_garbage_collector() -> None:
    api = FakeApi()
    body = service()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    run(api, body)
    assert api.take_calls() == []


# --- Saying why a service is not ready: what it costs ------------------------------------------


def settle(api: FakeApi, name: str, ready: int | None = None, pods: int | None = None) -> None:
    """The StatefulSet controller's status: it has seen the spec, with ``pods`` pods, ``ready`` of them ready."""
    sts = api.objects[("StatefulSet", name)]
    replicas = sts["spec"]["replicas"]
    sts["metadata"]["generation"] = 1
    sts["status"] = {
        "observedGeneration": 1,
        "replicas": replicas if pods is None else pods,
        "readyReplicas": replicas if ready is None else ready,
        "updatedReplicas": replicas if pods is None else pods,
        "currentRevision": "r1",
        "updateRevision": "r1",
    }


def pod_of(api: FakeApi, sts_name: str, ordinal: int, **status: Any) -> Manifest:
    uid = api.objects[("StatefulSet", sts_name)]["metadata"]["uid"]
    component = "dispatcher" if sts_name.endswith("dispatcher") else "worker"
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"{sts_name}-{ordinal}",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/component": component, "controller-revision-hash": "r1"},
            "ownerReferences": [{"uid": uid}],
        },
        "status": status,
    }


def test_a_ready_service_reads_nothing_to_explain_itself() -> None:
    api = FakeApi()
    run(api, service())
    settle(api, "demo-dispatcher")
    settle(api, "demo-worker")
    api.take_calls()
    run(api, service())
    assert api.take_calls() == [("status", "demo")]  # now Ready
    run(api, service())
    assert api.take_calls() == []


def test_pods_a_statefulset_cannot_create_cost_one_read_of_its_events_and_the_status_says_why() -> None:
    api = FakeApi()
    run(api, service())
    settle(api, "demo-worker", ready=0, pods=0)
    message = (
        'create Pod demo-worker-0 in StatefulSet demo-worker failed error: pods "demo-worker-0" is forbidden: '
        "no PriorityClass with name does-not-exist was found"
    )
    api.object_events[("StatefulSet", "demo-worker")] = [
        {"type": "Warning", "reason": "FailedCreate", "message": message, "lastTimestamp": "t"}
    ]
    api.take_calls()
    run(api, service())
    assert api.take_calls() == [("list-events", "StatefulSet"), ("status", "demo")]
    workers = next(c for c in api.status["conditions"] if c["type"] == "WorkersReady")  # type: ignore[index]
    assert workers["reason"] == "FailedCreate"
    assert workers["message"].endswith("no PriorityClass with name does-not-exist was found")
    run(api, service())
    assert api.take_calls() == [("list-events", "StatefulSet")]  # unchanged: nothing written


def test_unschedulable_and_crashing_pods_are_explained_from_the_cache_alone() -> None:
    api = FakeApi()
    run(api, service())
    settle(api, "demo-dispatcher", ready=0)
    settle(api, "demo-worker", ready=0)
    scheduler = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    pods = [
        pod_of(api, "demo-dispatcher", 0, conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": scheduler}]),
        pod_of(api, "demo-worker", 0, containerStatuses=[
            {"name": "server", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}}]),
        pod_of(api, "demo-worker", 1),
    ]  # fmt: skip
    api.take_calls()
    reconcile.reconcile(api, CONFIG, {**service(), "status": api.status}, Observed(api.objects, pods))
    assert api.take_calls() == [("status", "demo")]
    by_type = {c["type"]: c for c in api.status["conditions"]}  # type: ignore[index]
    assert by_type["DispatcherReady"]["reason"] == "Unschedulable"
    assert by_type["DispatcherReady"]["message"].endswith(f"cannot be scheduled: {scheduler}")
    assert by_type["WorkersReady"]["reason"] == "CrashLoopBackOff"
    assert by_type["Ready"]["reason"] == "Unschedulable"


def test_a_running_but_unready_dispatcher_is_asked_why_and_a_ready_one_is_not() -> None:
    api = FakeApi()
    asked: list[str] = []
    detail = "not ok: running: dispatcher serving on port 5050; 2 of 3 workers registered: waiting for every listed"

    def read(url: str) -> str:
        asked.append(url)
        return detail

    readers = Readers(read_readiness=read)
    run(api, service())
    settle(api, "demo-dispatcher", ready=0)
    settle(api, "demo-worker")
    dispatcher = pod_of(api, "demo-dispatcher", 0, podIP="10.1.2.3",
                        conditions=[{"type": "Ready", "status": "False"}],
                        containerStatuses=[{"name": "dispatcher", "state": {"running": {}}}])  # fmt: skip
    api.take_calls()
    reconcile.reconcile(api, CONFIG, {**service(), "status": api.status}, Observed(api.objects, [dispatcher]),
                        readers)  # fmt: skip
    assert asked == ["http://10.1.2.3:8080/readyz"]
    assert api.take_calls() == [("status", "demo")]  # no request to the API server for it
    ready = next(c for c in api.status["conditions"] if c["type"] == "DispatcherReady")  # type: ignore[index]
    assert ready["reason"] == "ServerNotReady" and ready["message"].endswith("2 of 3 workers registered: "
                                                                             "waiting for every listed")  # fmt: skip
    settle(api, "demo-dispatcher")
    reconcile.reconcile(api, CONFIG, {**service(), "status": api.status}, Observed(api.objects, [dispatcher]),
                        readers)  # fmt: skip
    assert len(asked) == 1, "a ready dispatcher is not asked"


def autoscaled(replicas: int = 1) -> Manifest:
    return service(workers={"replicas": replicas}, autoscaling={"minReplicas": 1, "maxReplicas": 4})


def test_the_tfdata_autoscaler_adds_workers_while_trainers_stall_on_saturated_workers() -> None:
    api, clock = FakeApi(), Clock()
    fetched: list[str] = []

    def fetch(url: str) -> Any:
        fetched.append(url)
        return STALLED_SIGNALS

    auto = Readers(fetch=fetch, clock=clock)
    body = autoscaled(1)
    decisions = []
    for _ in range(12):  # a reading every 5 s for a minute
        outcome = reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, api.observed(), auto)
        decisions.append(outcome.requeue_after)
        scaled = [c for c in api.take_calls() if c[0] == "scale"]
        if scaled:
            break
        clock.now += 5
    assert scaled, f"no scale after a minute of stalled, saturated readings (requeues: {decisions})"
    ((_, what),) = scaled
    replicas = int(what.split("=")[1])
    assert 1 < replicas <= 4
    assert fetched and all(u.endswith("/v1/signals") for u in fetched)
    event = next(m for _, r, m in api.events if r == "Scaled")
    assert event.startswith(f"Scaled workers from 1 to {replicas}: ") and "38%" in event
    # The same pass already built the StatefulSet for the new count, and the status says why.
    assert api.objects[("StatefulSet", "demo-worker")]["spec"]["replicas"] == replicas
    assert api.status["autoscaling"]["desiredReplicas"] == replicas  # type: ignore[index]
    # The written body carries the new count, so the cache does not scale the workers back.
    assert any(w.get("kind") == "TFDataService" and w["spec"]["workers"]["replicas"] == replicas
               for w in outcome.written)  # fmt: skip


def test_a_reconcile_between_readings_reads_nothing_and_asks_to_come_back() -> None:
    api, clock = FakeApi(), Clock()
    reads: list[str] = []
    auto = Readers(fetch=lambda url: reads.append(url) or STALLED_SIGNALS, clock=clock)
    reconcile.reconcile(api, CONFIG, {**autoscaled(), "status": api.status}, api.observed(), auto)
    api.take_calls()
    clock.now += 1
    outcome = reconcile.reconcile(api, CONFIG, {**autoscaled(), "status": api.status}, api.observed(), auto)
    assert len(reads) == 1 and api.take_calls() == []
    assert outcome.requeue_after is not None and 0 < outcome.requeue_after <= 60


def test_a_cpu_autoscaled_service_is_left_to_its_hpa() -> None:
    api = FakeApi()
    auto = Readers(fetch=lambda url: pytest.fail("read a dispatcher for a CPU service"))
    body = service(
        workers={"replicas": 2, "resources": {"requests": {"cpu": "1"}}},
        autoscaling={"metric": "CPU", "maxReplicas": 4},
    )
    outcome = reconcile.reconcile(api, CONFIG, body, api.observed(), auto)
    assert ("HorizontalPodAutoscaler", "demo-worker") in api.objects and outcome.requeue_after is None


# --- Held changes: rescalePolicy WhenIdle and suspend -------------------------------------


def static(**spec: Any) -> Manifest:
    return service(shardingPolicy="FILE", **spec)


def dispatcher_pod(phase: str = "Running") -> Manifest:
    labels = {
        "app.kubernetes.io/component": "dispatcher",
        "app.kubernetes.io/instance": "demo",
    }
    return {
        "kind": "Pod",
        "metadata": {"name": "demo-dispatcher-0", "namespace": "ml", "labels": labels},
        "status": {"phase": phase, "podIP": "10.0.0.9"},
    }


class FakeSignals:
    """The dispatcher's /v1/signals as the test sets it; counts the reads."""

    def __init__(self, reading: bool, idle: float = 0.0) -> None:
        self.reading, self.idle, self.reads = reading, idle, 0
        self.error: str | None = None

    def __call__(self, url: str) -> ServiceSignals | str:
        self.reads += 1
        assert url == "http://10.0.0.9:8080/v1/signals", url
        if self.error:
            return self.error
        return service_signals(self.reading, self.idle)


def run_with(api: FakeApi, body: Manifest, signals: FakeSignals, phase: str = "Running") -> Outcome:
    observed = Observed(api.observed().objects, [dispatcher_pod(phase)])
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, Readers(fetch=signals))


def replicas(api: FakeApi, name: str) -> int:
    return int(api.objects[("StatefulSet", name)]["spec"]["replicas"])


def condition(api: FakeApi, kind: str) -> Manifest:
    return next(c for c in api.status["conditions"] if c["type"] == kind)  # type: ignore[index]


def listed(api: FakeApi) -> int:
    config = builders.read_config(api.objects[("StatefulSet", "demo-dispatcher")])
    return len((config or {})["worker_addresses"])


def test_a_settled_static_service_never_reads_the_signal() -> None:
    api, signals = FakeApi(), FakeSignals(reading=True)
    run_with(api, static(), signals)
    api.take_calls()
    outcome = run_with(api, static(), signals)
    assert api.take_calls() == [] and signals.reads == 0 and outcome.requeue_after is None


def test_a_static_rescale_is_held_while_a_client_reads_then_carried_out() -> None:
    api, signals = FakeApi(), FakeSignals(reading=True)
    run_with(api, static(), signals)
    api.take_calls()
    scaled = static(workers={"replicas": 3})

    outcome = run_with(api, scaled, signals)
    assert api.take_calls() == [("event", "RescaleHeld"), ("status", "demo")]
    assert signals.reads == 1 and outcome.requeue_after == hold.RECHECK_SECONDS
    assert replicas(api, "demo-worker") == 2 and listed(api) == 2
    held = api.status["held"]  # type: ignore[index]
    assert held["change"] == "workers 2→3" and "rescalePolicy: Immediate" in held["message"]
    assert api.status["workers"]["desired"] == 3 and api.status["workers"]["current"] == 2  # type: ignore[index]
    workers = condition(api, "WorkersReady")
    assert workers["reason"] == "RescaleHeld" and "1 clients attached to jobs" in workers["message"]

    # Still reading: one read, nothing written, and a look again later.
    outcome = run_with(api, scaled, signals)
    assert api.take_calls() == [] and signals.reads == 2 and outcome.requeue_after == hold.RECHECK_SECONDS

    signals.reading, signals.idle = False, 8.0
    outcome = run_with(api, scaled, signals)
    calls = api.take_calls()
    assert calls[:2] == [
        ("dry-run", "StatefulSet/demo-dispatcher"),
        ("apply", "StatefulSet/demo-dispatcher"),
    ]
    assert ("event", "HeldChangeCarriedOut") in calls and calls[-1] == (
        "status",
        "demo",
    )
    assert listed(api) == 3 and outcome.requeue_after is None
    assert "held" not in api.status  # type: ignore[operator]
    # Under way now (the dispatcher has the longer list): never held again, never read again.
    signals.reading = True
    run_with(api, scaled, signals)
    assert signals.reads == 3


def test_an_unreadable_signal_counts_as_reading() -> None:
    api, signals = FakeApi(), FakeSignals(reading=False, idle=60)
    run_with(api, static(), signals)
    api.take_calls()
    signals.error = "connection refused"
    run_with(api, static(workers={"replicas": 1}), signals)
    assert api.take_calls() == [("event", "RescaleHeld"), ("status", "demo")]
    assert "connection refused" in api.status["held"]["message"]  # type: ignore[index]
    assert replicas(api, "demo-worker") == 2


NO_SNAPSHOTS = SnapshotsReport((), "journal")
TIMED_OUT = "GET http://10.0.0.9:8080/v1/signals failed: no whole answer within 2s (timed out)"


def run_read(api: FakeApi, body: Manifest, pods: Readers) -> Outcome:
    """A reconcile of a service whose dispatcher runs, with ``pods`` kept between reconciles."""
    observed = Observed(api.observed().objects, [dispatcher_pod()])
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, pods)


def test_a_dispatcher_that_did_not_answer_is_backed_off_and_the_change_stays_held_meanwhile() -> None:
    api, clock, signals = FakeApi(), Clock(), FakeSignals(reading=False, idle=60)
    pods = Readers(fetch=signals, fetch_snapshots=lambda url: NO_SNAPSHOTS, clock=clock)
    run_read(api, static(), pods)
    api.take_calls()
    signals.error, scaled = TIMED_OUT, static(workers={"replicas": 1})
    outcome = run_read(api, scaled, pods)
    assert signals.reads == 1 and api.take_calls() == [("event", "RescaleHeld"), ("status", "demo")]
    assert outcome.requeue_after == hold.RECHECK_SECONDS  # the back-off's first 5 s
    # Backed off: not asked, and held as when it cannot be read (fail closed); the status keeps saying
    # what the last read found, so nothing is written.
    clock.now += 2
    outcome = run_read(api, scaled, pods)
    assert signals.reads == 1 and replicas(api, "demo-worker") == 2 and api.take_calls() == []
    assert TIMED_OUT in api.status["held"]["message"]  # type: ignore[index]
    assert outcome.requeue_after == hold.RECHECK_SECONDS
    # Each failure doubles the wait, and the reconcile comes back no sooner than it ends.
    waits = []
    for _ in range(3):
        clock.now += 100  # past any back-off so far: asked, and fails again
        run_read(api, scaled, pods)
        clock.now += 1
        waits.append(run_read(api, scaled, pods).requeue_after)
    assert signals.reads == 4 and waits == [9.0, 19.0, 39.0]
    # A good answer: the change goes ahead, and the next failure starts from 5 s again.
    signals.error = None
    clock.now += 40
    run_read(api, scaled, pods)
    assert signals.reads == 5 and replicas(api, "demo-worker") == 1
    assert "held" not in api.status  # type: ignore[operator]
    assert pods.backoff.failed((("ml", ("demo-dispatcher-0", None, "10.0.0.9")), "/v1/signals"), clock.now, "x") == 5.0


def test_a_read_over_its_namespaces_cap_is_not_waited_for_and_the_reconcile_comes_back_shortly() -> None:
    api, clock, signals = FakeApi(), Clock(), FakeSignals(reading=False, idle=60)
    pods = Readers(fetch=signals, fetch_snapshots=lambda url: NO_SNAPSHOTS, clock=clock)
    run_read(api, static(), pods)
    api.take_calls()
    scaled = static(workers={"replicas": 1})
    # Two reads of namespace ml's pods under way on other threads: this reconcile does not wait for one.
    with pods.cap.slot("ml") as first, pods.cap.slot("ml") as second:
        assert first and second
        outcome = run_read(api, scaled, pods)
    assert signals.reads == 0 and replicas(api, "demo-worker") == 2  # held: fail closed
    assert "2 reads of namespace ml's pods were under way" in api.status["held"]["message"]  # type: ignore[index]
    assert outcome.requeue_after == max(hold.RECHECK_SECONDS, BUSY_RETRY_SECONDS)
    # Not a failure of the pod: the next reconcile asks it at once, and the change goes ahead.
    run_read(api, scaled, pods)
    assert signals.reads == 1 and replicas(api, "demo-worker") == 1


def test_a_drain_budget_read_that_was_not_asked_is_not_kept_and_comes_back_when_it_may_be_asked() -> None:
    api, clock, signals = FakeApi(), Clock(), FakeSignals(reading=False, idle=60)
    pods = Readers(fetch=signals, clock=clock)
    run(api, static())
    settle(api, "demo-dispatcher")
    settle(api, "demo-worker")
    signals.error = TIMED_OUT
    run_drains(api, static(), pods)
    assert signals.reads == 1 and budget(api) == 0  # cannot tell: drains wait
    clock.now += drain.RECHECK_SECONDS  # the kept reading expired, the back-off (5 s) too
    run_drains(api, static(), pods)
    assert signals.reads == 2
    clock.now += drain.RECHECK_SECONDS
    with pods.cap.slot("ml"), pods.cap.slot("ml"):
        outcome = run_drains(api, static(), pods)
    assert signals.reads == 2 and outcome.requeue_after == BUSY_RETRY_SECONDS and budget(api) == 0
    outcome = run_drains(api, static(), pods)  # over the cap was not kept: asked now
    assert signals.reads == 3 and outcome.requeue_after == drain.RECHECK_SECONDS
    clock.now += drain.RECHECK_SECONDS
    run_drains(api, static(), pods)
    assert signals.reads == 4  # its 4th failure: backed off 40 s
    clock.now += drain.RECHECK_SECONDS
    outcome = run_drains(api, static(), pods)
    assert signals.reads == 4 and outcome.requeue_after == 10.0  # when it may be asked, not every 0.5 s
    assert budget(api) == 0 and api.status["drains"]["unreadableSince"]  # type: ignore[index]


def test_over_the_cap_the_budget_stands_as_last_read_and_nothing_is_written() -> None:
    api, clock, signals = FakeApi(), Clock(), FakeSignals(reading=False, idle=60)
    pods = Readers(fetch=signals, clock=clock)
    run(api, static())
    settle(api, "demo-dispatcher")
    settle(api, "demo-worker")
    run_drains(api, static(), pods)
    assert signals.reads == 1 and budget(api) == 1
    api.take_calls()
    clock.now += drain.RECHECK_SECONDS  # the reading expired
    with pods.cap.slot("ml"), pods.cap.slot("ml"):
        outcome = run_drains(api, static(), pods)
    # Not read this time: the last reading stands (no flap of the budget), and the reconcile comes back.
    assert signals.reads == 1 and api.take_calls() == [] and budget(api) == 1
    assert outcome.requeue_after == BUSY_RETRY_SECONDS
    run_drains(api, static(), pods)
    assert signals.reads == 2 and budget(api) == 1


def test_immediate_and_dynamic_rescales_never_read_the_signal() -> None:
    signals = FakeSignals(reading=True)
    for body, scaled in [
        (
            static(workers={"rescalePolicy": "Immediate"}),
            static(workers={"replicas": 3, "rescalePolicy": "Immediate"}),
        ),
        (service(), service(workers={"replicas": 3})),
    ]:
        api = FakeApi()
        run_with(api, body, signals)
        api.take_calls()
        run_with(api, scaled, signals)
        assert (
            "apply",
            "StatefulSet/demo-dispatcher" if "FILE" in str(body) else "StatefulSet/demo-worker",
        ) in (api.take_calls())
    assert signals.reads == 0


def test_a_change_held_past_rescale_max_wait_goes_ahead_with_a_warning() -> None:
    api, signals = FakeApi(), FakeSignals(reading=True)
    body = static(workers={"rescaleMaxWaitSeconds": 60})
    run_with(api, body, signals)
    api.take_calls()
    scaled = static(workers={"replicas": 3, "rescaleMaxWaitSeconds": 60})
    run_with(api, scaled, signals)
    assert api.take_calls() == [("event", "RescaleHeld"), ("status", "demo")]
    api.status["held"]["since"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    run_with(api, scaled, signals)
    assert ("event", "HeldChangeForced") in api.take_calls()
    assert api.events[-1][0] == "Warning" and "rescaleMaxWaitSeconds 60" in api.events[-1][2]
    assert listed(api) == 3


# --- The workers' disruption budget: drains wait while a client reads a static service ---------


def run_drains(api: FakeApi, body: Manifest, readers: Readers) -> Outcome:
    """A reconcile of a service whose dispatcher and two workers run, with readers kept between reconciles."""
    pods = [dispatcher_pod(), *(pod_of(api, "demo-worker", i, phase="Running") for i in range(2))]
    observed = Observed(api.observed().objects, pods)
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)


def budget(api: FakeApi) -> int:
    return int(api.objects[("PodDisruptionBudget", "demo-worker")]["spec"]["maxUnavailable"])


def test_drains_wait_while_a_client_reads_a_static_service_and_the_signal_is_read_every_30_s() -> None:
    api, clock, signals = FakeApi(), Clock(), FakeSignals(reading=False, idle=60)
    readers = Readers(fetch=signals, clock=clock)
    run(api, static())
    settle(api, "demo-dispatcher")
    settle(api, "demo-worker")
    outcome = run_drains(api, static(), readers)
    assert budget(api) == 1 and signals.reads == 1 and "drains" not in api.status  # type: ignore[operator]
    assert outcome.requeue_after == drain.RECHECK_SECONDS
    api.take_calls()

    # A client starts reading: nothing is read (nor written) until the last reading is 30 s old.
    signals.reading = True
    clock.now += 10
    outcome = run_drains(api, static(), readers)
    assert api.take_calls() == [] and signals.reads == 1 and outcome.requeue_after == 20
    clock.now += 20
    outcome = run_drains(api, static(), readers)
    assert signals.reads == 2 and budget(api) == 0
    calls = api.take_calls()
    assert calls == [
        ("dry-run", "PodDisruptionBudget/demo-worker"),
        ("apply", "PodDisruptionBudget/demo-worker"),
        ("event", "DrainsHeld"),
        ("status", "demo"),
    ]
    drains = api.status["drains"]  # type: ignore[index]
    assert drains["maxUnavailable"] == 0 and drains["message"].startswith("Drains wait: a client reads")
    workers = condition(api, "WorkersReady")
    assert workers["status"] == "True" and workers["message"] == "2/2 workers are ready. " + drains["message"]
    assert api.events[-1][2].endswith(
        "(clients read from the service: 1 clients attached to jobs (the dispatcher's journal))"
    )

    # Still reading, 30 s later: one GET to the dispatcher, no request to the API server.
    clock.now += 30
    run_drains(api, static(), readers)
    assert signals.reads == 3 and api.take_calls() == []

    # The reader stops; a moment later the quiet is not long enough, then it is.
    signals.reading, signals.idle = False, 2.0
    clock.now += 30
    outcome = run_drains(api, static(), readers)
    assert signals.reads == 4 and budget(api) == 0 and api.take_calls() == [] and outcome.requeue_after == 3
    signals.idle = 5.0
    clock.now += 3
    run_drains(api, static(), readers)
    assert signals.reads == 5 and budget(api) == 1
    assert ("event", "DrainsAllowed") in api.take_calls()
    assert "drains" not in api.status  # type: ignore[operator]
    assert condition(api, "WorkersReady")["message"] == "2/2 workers are ready."


def test_drains_held_past_rescale_max_wait_go_ahead_with_a_warning_while_the_client_still_reads() -> None:
    api, clock, signals = FakeApi(), Clock(), FakeSignals(reading=True)
    body = static(workers={"rescaleMaxWaitSeconds": 600})
    run(api, body)
    run_drains(api, body, Readers(fetch=signals, clock=clock))
    assert budget(api) == 0
    api.status["drains"]["since"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    api.take_calls()
    run_drains(api, body, Readers(fetch=signals, clock=clock))
    assert budget(api) == 1 and ("event", "DrainsForced") in api.take_calls()
    assert api.events[-1][0] == "Warning" and "rescaleMaxWaitSeconds (600 s)" in api.events[-1][2]
    # The wait is remembered while the client reads: the budget stays 1, and nothing is written.
    run_drains(api, body, Readers(fetch=signals, clock=clock))
    assert budget(api) == 1 and api.take_calls() == []
    assert api.status["drains"]["since"] == "2026-01-01T00:00:00Z"  # type: ignore[index]


@pytest.mark.parametrize(
    "body", [static(workers={"rescalePolicy": "Immediate"}), service(), service(shardingPolicy="OFF")]
)
def test_immediate_dynamic_and_off_never_read_the_signal_for_drains(body: Manifest) -> None:
    api, signals = FakeApi(), FakeSignals(reading=True)
    run(api, body)
    outcome = run_drains(api, body, Readers(fetch=signals))
    assert signals.reads == 0 and outcome.requeue_after is None
    pdb = api.objects.get(("PodDisruptionBudget", "demo-worker"))
    assert (pdb["spec"]["maxUnavailable"] if pdb else None) == (None if "OFF" in str(body) else 1)


def test_suspend_is_held_while_reading_then_removes_every_pod_and_keeps_the_rest() -> None:
    api, signals = FakeApi(), FakeSignals(reading=True)
    run_with(api, static(), signals)
    api.take_calls()
    before = copy.deepcopy(api.objects)
    address = api.status["dispatcherAddress"]  # type: ignore[index]

    outcome = run_with(api, static(suspend=True), signals)
    assert api.take_calls() == [("event", "SuspendHeld"), ("status", "demo")]
    assert outcome.requeue_after == hold.RECHECK_SECONDS
    assert condition(api, "Suspended")["status"] == "False" and condition(api, "Ready")["reason"] == "SuspendHeld"
    assert api.status["held"]["change"] == "suspend"  # type: ignore[index]

    signals.reading, signals.idle = False, 30.0
    run_with(api, static(suspend=True), signals)
    calls = api.take_calls()
    assert [c for c in calls if c[0] == "apply"] == [
        ("apply", "StatefulSet/demo-dispatcher"),
        ("apply", "StatefulSet/demo-worker"),
    ]
    assert ("event", "Suspending") in calls and (
        "event",
        "HeldChangeCarriedOut",
    ) in calls
    assert replicas(api, "demo-dispatcher") == 0 and replicas(api, "demo-worker") == 0
    # Same template (so the same journal and list on resume), same Services, same address.
    for key, obj in before.items():
        if key[0] == "StatefulSet":
            assert obj["spec"]["template"] == api.objects[key]["spec"]["template"]
        else:
            assert obj == api.objects[key], key
    assert condition(api, "Suspended")["status"] == "True" and condition(api, "Ready")["reason"] == "Suspended"
    assert api.status["dispatcherAddress"] == address  # type: ignore[index]

    # Suspended: no pod runs, nothing to read, nothing to do.
    reads = signals.reads
    run_with(api, static(suspend=True), signals, phase="Pending")
    assert api.take_calls() == [] and signals.reads == reads

    run_with(api, static(), signals, phase="Pending")
    calls = api.take_calls()
    assert [c for c in calls if c[0] == "apply"] == [
        ("apply", "StatefulSet/demo-dispatcher"),
        ("apply", "StatefulSet/demo-worker"),
    ]
    assert ("event", "Resuming") in calls
    assert replicas(api, "demo-dispatcher") == 1 and replicas(api, "demo-worker") == 2 and listed(api) == 2
    assert condition(api, "Suspended")["reason"] == "Resumed" and signals.reads == reads


def test_suspend_pauses_cpu_autoscaling() -> None:
    api = FakeApi()
    auto = {
        "autoscaling": {"metric": "CPU", "maxReplicas": 4},
        "workers": {"replicas": 2, "resources": {"requests": {"cpu": "1"}}},
    }
    run_with(api, service(**auto), FakeSignals(reading=False, idle=60))
    assert ("HorizontalPodAutoscaler", "demo-worker") in api.objects
    run_with(api, service(suspend=True, **auto), FakeSignals(reading=False, idle=60))
    assert ("HorizontalPodAutoscaler", "demo-worker") not in api.objects
    run_with(api, service(**auto), FakeSignals(reading=False, idle=60))
    assert ("HorizontalPodAutoscaler", "demo-worker") in api.objects


def test_suspend_pauses_tfdata_autoscaling_and_keeps_its_status() -> None:
    api = FakeApi()
    auto = {"autoscaling": {"maxReplicas": 4}, "workers": {"replicas": 2, "rescalePolicy": "Immediate"}}
    signals = FakeSignals(reading=False, idle=600)
    run_with(api, service(**auto), signals)
    before = api.status["autoscaling"]  # type: ignore[index]
    assert signals.reads == 1 and before is not None
    api.take_calls()
    outcome = run_with(api, service(suspend=True, **auto), signals)
    assert signals.reads == 1, "a suspended service's dispatcher is not read"
    assert not [c for c in api.take_calls() if c[0] == "scale"] and outcome.requeue_after is None
    assert api.status["autoscaling"] == before  # type: ignore[index]


def _pod(component: str, name: str, created: str, ready_since: str | None = None) -> Manifest:
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_since}] if ready_since else []
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": {"app.kubernetes.io/instance": "demo", "app.kubernetes.io/component": component},
        },
        "status": {"conditions": conditions},
    }


def test_workers_of_an_earlier_journal_less_dispatcher_pod_are_replaced_and_only_they() -> None:
    body = service(dispatcher={"faultTolerantMode": False})
    api = FakeApi()
    run(api, body)
    api.take_calls()
    pods = [
        _pod("dispatcher", "demo-dispatcher-0", created="2026-01-01T00:05:00Z", ready_since="2026-01-01T00:05:05Z"),
        # registered with the dispatcher pod before this one:
        _pod("worker", "demo-worker-0", created="2026-01-01T00:00:00Z", ready_since="2026-01-01T00:01:00Z"),
        # ready only once this dispatcher ran:
        _pod("worker", "demo-worker-1", created="2026-01-01T00:00:00Z", ready_since="2026-01-01T00:05:09Z"),
    ]
    for pod in pods:
        api.objects[("Pod", pod["metadata"]["name"])] = pod
    observed = Observed(api.observed().objects, pods)
    outcome = reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed)
    assert api.take_calls() == [("delete", "Pod/demo-worker-0"), ("event", "RestartedStaleWorker")]
    assert outcome.result == "changed"
    # With a journal the restarted dispatcher continues the task ids: the same pods stay.
    journaled = service(dispatcher={"faultTolerantMode": True})
    api.objects[("Pod", "demo-worker-0")] = pods[1]
    reconcile.reconcile(api, CONFIG, {**journaled, "status": api.status}, observed)
    assert ("event", "RestartedStaleWorker") not in api.take_calls()


# --- At scale: a settled cluster costs nothing; an unready service is read once per resync ------

# As `make bench` writes them (benchmarks/bench.py): DYNAMIC, 4 workers, a journal claim, on kwok's nodes.
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
BENCH = {"dispatcher": {"tolerations": [KWOK_TOLERATION]}, "workers": {"replicas": 4, "tolerations": [KWOK_TOLERATION]}}
UNBOUND = "0/10 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found"


def kwok_pod(api: FakeApi, sts_name: str, ordinal: int, ready: bool = True, scheduled: bool = True) -> Manifest:
    """A pod as kwok reports it: Running and Ready with a pod IP; ``ready=False``: still running, but
    marked not ready (as the node lifecycle controller does); ``scheduled=False``: Pending, the
    scheduler waiting for its claim."""
    pod = pod_of(api, sts_name, ordinal)
    if not scheduled:
        waiting = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNBOUND}
        pod["status"] = {"phase": "Pending", "conditions": [waiting]}
        return pod
    running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    pod["status"] = {
        "phase": "Running",
        "podIP": f"10.0.0.{ordinal + (10 if 'worker' in sts_name else 1)}",
        "conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "containerStatuses": [{"name": "server", "ready": ready, "restartCount": 0, "state": running}],
    }
    return pod


def test_a_settled_bench_service_costs_nothing_and_an_unready_one_one_read_of_each_per_resync() -> None:
    """The reconciles that the pods' events and the resyncs queue over three minutes: a ready
    service sends no request; one whose dispatcher waits for its claim and one of whose workers
    runs but is not ready lists its namespace's claim Events and asks that worker's /readyz at most
    once per resync, and writes its status only when it first says why."""
    clock, asked, infos = Clock(), [], []
    readers = Readers(
        clock=clock,
        read_readiness=lambda url: asked.append(url) or "not ok: starting",
        # A kwok pod serves nothing: its /serverinfo never answers.
        read_server_info=lambda url: infos.append(url),
    )
    body = service(**BENCH)

    ready = FakeApi()
    run(ready, body)
    settle(ready, "demo-dispatcher")
    settle(ready, "demo-worker")
    ready_pods = [kwok_pod(ready, "demo-dispatcher", 0)] + [kwok_pod(ready, "demo-worker", i) for i in range(4)]

    unready = FakeApi()
    run(unready, body)
    settle(unready, "demo-dispatcher", ready=0)
    settle(unready, "demo-worker", ready=3)
    unready_pods = [kwok_pod(unready, "demo-dispatcher", 0, scheduled=False)]
    unready_pods += [kwok_pod(unready, "demo-worker", i, ready=i != 3) for i in range(4)]
    unready.object_events[("PersistentVolumeClaim", "journal-demo-dispatcher-0")] = [
        {"type": "Warning", "reason": "ProvisioningFailed", "message": "no volume plugin matched", "lastTimestamp": "t"}
    ]
    # The list is the namespace's: another claim's later Warning is not this service's.
    unready.object_events[("PersistentVolumeClaim", "journal-other-dispatcher-0")] = [
        {"type": "Warning", "reason": "ClaimLost", "message": "another claim's", "lastTimestamp": "u"}
    ]

    def reconcile_both() -> None:
        for api, pods in ((ready, ready_pods), (unready, unready_pods)):
            observed = Observed(api.observed().objects, pods)
            reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)

    ready.take_calls(), unready.take_calls()
    reconcile_both()  # each says what it is now: Ready, or why not
    assert ready.take_calls() == [("status", "demo")]
    assert unready.take_calls() == [("list-events", "PersistentVolumeClaim"), ("status", "demo")]
    dispatcher = condition(unready, "DispatcherReady")
    assert dispatcher["reason"] == "ProvisioningFailed" and dispatcher["message"].endswith("no volume plugin matched")
    assert condition(unready, "WorkersReady")["reason"] == "ServerNotReady" and asked == [
        "http://10.0.0.13:8080/readyz"
    ]

    window = 3 * CONFIG.resync_seconds
    for _ in range(int(window / 2)):  # a reconcile every 2 s, as a busy cluster's events queue them
        clock.now += 2
        reconcile_both()
    assert ready.take_calls() == []
    resyncs = int(window // CONFIG.resync_seconds)
    assert unready.take_calls() == [("list-events", "PersistentVolumeClaim")] * resyncs
    assert len(asked) == 1 + resyncs, asked
    # The ready dispatcher is asked what it runs off the reconcile's thread, and again only after
    # SERVER_INFO_RETRY_SECONDS when it does not answer (the unready one is not asked).
    readers.server_info.wait()
    tries = 1 + int(window // SERVER_INFO_RETRY_SECONDS)
    assert infos == ["http://10.0.0.1:8080/serverinfo"] * tries


def test_what_the_ready_dispatcher_runs_is_read_once_per_pod_into_the_status() -> None:
    api, clock, asked = FakeApi(), Clock(), []
    info = ServerInfo(
        tensorflow_version="2.16.2",
        python_version="3.11.2",
        graph_def=GraphDefVersions(producer=1766, min_consumer=0, min_producer=0),
        preloaded=("tensorflow_text",),
        ops=("Const", "MapDataset", "TFText>WhitespaceTokenizeWithOffsetsV2"),
        preloaded_ops=("TFText>WhitespaceTokenizeWithOffsetsV2",),
    )
    readers = Readers(clock=clock, read_server_info=lambda url: asked.append(url) or info)
    run(api, service())
    settle(api, "demo-dispatcher")
    settle(api, "demo-worker")
    pods = [kwok_pod(api, "demo-dispatcher", 0)]
    pods[0]["metadata"]["uid"] = "uid-of-dispatcher-0"

    def again() -> Outcome:
        observed = Observed(api.observed().objects, pods)
        return reconcile.reconcile(api, CONFIG, {**service(), "status": api.status}, observed, readers)

    api.take_calls()
    outcome = again()  # starts the read, and comes back for its answer
    assert outcome.requeue_after is not None and outcome.requeue_after <= 2.0
    readers.server_info.wait()
    again()
    assert asked == ["http://10.0.0.1:8080/serverinfo"]
    assert api.status["server"] == {  # type: ignore[index]
        "tensorflowVersion": "2.16.2",
        "pythonVersion": "3.11.2",
        "graphDefVersion": 1766,
        "preloaded": ["tensorflow_text"],
        "opCount": 3,
        "preloadedOps": ["TFText>WhitespaceTokenizeWithOffsetsV2"],
        "pod": "demo-dispatcher-0/uid-of-dispatcher-0",
    }
    # The next reconcile publishes it to trainers in the client ConfigMap, once.
    api.take_calls()
    again()
    assert [c for c in api.take_calls() if c[0] == "apply"] == [("apply", "ConfigMap/demo-client")]
    data = api.objects[("ConfigMap", "demo-client")]["data"]
    assert (data["TFDATA_SERVER_TENSORFLOW"], data["TFDATA_SERVER_GRAPH_DEF_VERSION"]) == ("2.16.2", "1766")
    assert data["TFDATA_SERVER_PRELOADED_OPS"] == "TFText>WhitespaceTokenizeWithOffsetsV2"
    for _ in range(5):
        clock.now += 400
        again()
    assert api.take_calls() == [] and len(asked) == 1, "the same pod is never asked again"


# --- Held while a snapshot is written: every change that takes workers away -------------------


class FakeSnapshots:
    """The dispatcher's /v1/snapshots as the test sets it (a state per path, or an error); counts the reads."""

    def __init__(self, **states: str) -> None:
        self.states, self.reads = states, 0
        self.error: str | None = None

    def __call__(self, url: str) -> SnapshotsReport | str:
        self.reads += 1
        assert url == "http://10.0.0.9:8080/v1/snapshots", url
        if self.error:
            return self.error
        found = tuple(SnapshotProgress(f"gs://b/{name}", state, journaled=True) for name, state in self.states.items())
        return SnapshotsReport(found, "snapshots named in the journal")


def run_saving(
    api: FakeApi, body: Manifest, saves: FakeSnapshots, signals: FakeSignals | None = None, clock: Clock | None = None
) -> Outcome:
    observed = Observed(api.observed().objects, [dispatcher_pod()])
    readers = Readers(
        fetch=signals or FakeSignals(reading=False, idle=60), fetch_snapshots=saves, clock=clock or Clock()
    )
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)


def test_a_dynamic_scale_down_waits_while_a_snapshot_is_written_then_goes_ahead() -> None:
    api, saves, signals = FakeApi(), FakeSnapshots(imagenet="IN_PROGRESS"), FakeSignals(reading=False, idle=60)
    run_saving(api, service(workers={"replicas": 3}), saves, signals)
    api.take_calls()
    assert saves.reads == 0, "a settled service never reads its snapshots"

    down = service(workers={"replicas": 2})
    outcome = run_saving(api, down, saves, signals)
    assert api.take_calls() == [("event", "RescaleHeld"), ("status", "demo")]
    assert saves.reads == 1 and signals.reads == 0  # a dynamic scale-down breaks no reader: no signal read
    assert outcome.requeue_after == hold.SNAPSHOT_RECHECK_SECONDS
    assert replicas(api, "demo-worker") == 3
    held = api.status["held"]  # type: ignore[index]
    assert held["change"] == "workers 3→2"
    assert held["message"].startswith("Scale-down 3→2 waits: snapshot gs://b/imagenet is being written")
    event = next(m for _, r, m in api.events if r == "RescaleHeld")
    assert "gs://b/imagenet" in event
    workers = condition(api, "WorkersReady")
    assert workers["reason"] == "RescaleHeld" and "gs://b/imagenet" in workers["message"]

    run_saving(api, down, saves, signals)  # still written: one read, nothing written
    assert api.take_calls() == [] and saves.reads == 2

    saves.states["imagenet"] = "COMPLETED"
    run_saving(api, down, saves, signals)
    calls = api.take_calls()
    assert ("apply", "StatefulSet/demo-worker") in calls and ("event", "HeldChangeCarriedOut") in calls
    assert replicas(api, "demo-worker") == 2 and "held" not in (api.status or {})
    run_saving(api, down, saves, signals)
    assert saves.reads == 3, "settled again: no read"


def test_an_unreadable_snapshots_endpoint_holds_only_a_service_with_spec_snapshots() -> None:
    for snapshots, kept in [({"snapshots": {"directory": "gs://b"}}, 3), ({}, 2)]:
        api, saves = FakeApi(), FakeSnapshots()
        saves.error = "GET http://10.0.0.9:8080/v1/snapshots answered 503 Service Unavailable"
        run_saving(api, service(workers={"replicas": 3}, **snapshots), saves)
        run_saving(api, service(workers={"replicas": 2}, **snapshots), saves)
        assert replicas(api, "demo-worker") == kept
        if kept == 3:
            assert "503 Service Unavailable), so it counts as being written" in api.status["held"]["message"]  # type: ignore[index]


def test_a_suspend_and_a_static_rescale_wait_for_the_snapshot_before_the_readers() -> None:
    api, saves, signals = FakeApi(), FakeSnapshots(a="COMPLETED", b="IN_PROGRESS"), FakeSignals(reading=False, idle=60)
    run_saving(api, static(), saves, signals)
    api.take_calls()
    run_saving(api, static(workers={"replicas": 3}), saves, signals)
    assert replicas(api, "demo-worker") == 2 and listed(api) == 2
    assert saves.reads == 1 and signals.reads == 0, "the snapshot holds it: the signal is not read"
    assert "snapshot gs://b/b is being written" in api.status["held"]["message"]  # type: ignore[index]
    run_saving(api, static(suspend=True), saves, signals)
    assert replicas(api, "demo-dispatcher") == 1 and replicas(api, "demo-worker") == 2
    assert api.status["held"]["change"] == "suspend"  # type: ignore[index]
    saves.states["b"] = "FAILED"
    run_saving(api, static(suspend=True), saves, signals)
    assert replicas(api, "demo-dispatcher") == 0 and replicas(api, "demo-worker") == 0
    assert saves.reads == 3 and signals.reads == 1


def test_the_autoscalers_scale_down_is_held_while_a_snapshot_is_written() -> None:
    api, clock, saves = FakeApi(), Clock(), FakeSnapshots(imagenet="IN_PROGRESS")
    signals = FakeSignals(reading=True)
    body = service(workers={"replicas": 3}, autoscaling={"minReplicas": 1, "maxReplicas": 4})
    readers = Readers(fetch=signals, fetch_snapshots=saves, clock=clock)
    observed = Observed(api.observed().objects, [dispatcher_pod()])
    reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)  # 3 workers run
    assert replicas(api, "demo-worker") == 3
    signals.reading, signals.idle = False, 600.0  # the trainers are gone
    scaled: list[tuple[str, str]] = []
    for _ in range(120):  # a reading every 5 s for ten minutes
        observed = Observed(api.observed().objects, [dispatcher_pod()])
        reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)
        if scaled := [c for c in api.take_calls() if c[0] == "scale"]:
            break
        clock.now += 5
    assert scaled, "the autoscaler never scaled an idle service down"
    ((_, what),) = scaled
    to = int(what.split("=")[1])
    assert to < 3
    # The same pass kept every worker, and says which snapshot holds them.
    assert replicas(api, "demo-worker") == 3
    assert api.status["held"]["change"] == f"workers 3→{to}"  # type: ignore[index]
    assert "snapshot gs://b/imagenet is being written" in api.status["held"]["message"]  # type: ignore[index]

    body["spec"]["workers"]["replicas"] = to  # what the Scale wrote
    saves.states["imagenet"] = "COMPLETED"
    clock.now += 1
    observed = Observed(api.observed().objects, [dispatcher_pod()])
    reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed, readers)
    assert replicas(api, "demo-worker") == to


def test_drains_wait_while_a_snapshot_is_written_and_the_snapshots_are_read_every_30_s() -> None:
    api, clock, saves = FakeApi(), Clock(), FakeSnapshots(imagenet="IN_PROGRESS")
    readers = Readers(fetch=FakeSignals(reading=False, idle=60), fetch_snapshots=saves, clock=clock)
    body = service(snapshots={"directory": "gs://b"})
    run(api, body)
    settle(api, "demo-dispatcher")
    settle(api, "demo-worker")
    api.take_calls()
    outcome = run_drains(api, body, readers)
    assert budget(api) == 0 and saves.reads == 1 and outcome.requeue_after == drain.RECHECK_SECONDS
    assert ("event", "DrainsHeld") in api.take_calls()
    assert "snapshot gs://b/imagenet is being written" in api.status["drains"]["message"]  # type: ignore[index]
    clock.now += 10
    run_drains(api, body, readers)
    assert saves.reads == 1 and api.take_calls() == []
    saves.states["imagenet"] = "COMPLETED"
    clock.now += 20
    run_drains(api, body, readers)
    assert saves.reads == 2 and budget(api) == 1 and "drains" not in api.status  # type: ignore[operator]
    assert ("event", "DrainsAllowed") in api.take_calls()


# --- One snapshot directory, one service (plan/snapshotdir.py) ----------------------------------


def with_directory(directory: str) -> Manifest:
    stored = service(snapshots={"directory": directory})
    stored["metadata"]["creationTimestamp"] = "2026-11-28T11:00:00Z"
    return stored


OLDER = DirectoryClaim("ml", "older", "gs://b/snaps", None, "2026-11-28T10:00:00Z")


def run_beside(api: FakeApi, body: Manifest, *others: DirectoryClaim) -> Outcome:
    observed = dataclasses.replace(api.observed(), directories=others)
    return reconcile.reconcile(api, CONFIG, {**body, "status": api.status}, observed)


def test_a_snapshot_directory_another_service_keeps_creates_nothing_warns_once_and_then_costs_nothing() -> None:
    api = FakeApi()
    outcome = run_beside(api, with_directory("gs://b/snaps/"), OLDER)
    assert api.take_calls() == [("event", "SnapshotDirectoryTaken"), ("status", "demo")]
    assert outcome.result == "invalid" and api.objects == {}
    ready = condition(api, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "SnapshotDirectoryTaken"
    assert "is the same as TFDataService older's snapshot directory gs://b/snaps" in ready["message"]
    outcome = run_beside(api, with_directory("gs://b/snaps/"), OLDER)
    assert api.take_calls() == [] and outcome.result == "invalid"
    # The other one gone (the cache no longer has it): created as any service.
    run_beside(api, with_directory("gs://b/snaps/"))
    assert sorted(k for k, v in api.take_calls() if k == "apply") == ["apply"] * len(CHILDREN)
    assert condition(api, "Ready")["reason"] != "SnapshotDirectoryTaken"


def test_a_running_service_edited_onto_another_services_directory_is_held_as_it_runs() -> None:
    api = FakeApi()
    run_beside(api, with_directory("gs://b/mine"), OLDER)
    api.take_calls()
    before = api.observed().objects
    run_beside(api, with_directory("gs://b/snaps/mine"), OLDER)
    assert api.take_calls() == [("event", "SnapshotDirectoryTaken"), ("status", "demo")]
    assert api.observed().objects == before, "nothing it has is changed or deleted"
    assert "gs://b/snaps/mine is inside TFDataService older's" in condition(api, "Ready")["message"]
    # Put back: it goes on, and a settled service beside an apart directory sends nothing.
    run_beside(api, with_directory("gs://b/mine"), OLDER)
    api.take_calls()
    run_beside(api, with_directory("gs://b/mine"), OLDER)
    assert api.take_calls() == []


def test_an_older_service_edited_onto_a_running_ones_directory_does_not_take_it() -> None:
    api = FakeApi()
    run_beside(api, with_directory("gs://b/snaps"))
    api.take_calls()
    # An older service names this one's directory now, but its pods still use another: this one keeps it.
    edited = dataclasses.replace(OLDER, published="gs://b/old")
    run_beside(api, with_directory("gs://b/snaps"), edited)
    assert api.take_calls() == []


def test_a_service_without_snapshots_is_not_held_by_anothers_directory() -> None:
    api = FakeApi()
    run_beside(api, service(), OLDER)
    assert ("event", "Created") in api.take_calls()
