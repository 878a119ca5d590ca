"""A queued TFDataService's Workload (``render/workload.py``) and what the service does about what Kueue
says (``plan/kueue.py``): queued, admitted with its flavors, evicted and its quota released, requeued,
suspended, left."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tfdata_operator.api import kueue, reasons, spec
from tfdata_operator.plan import kueue as queueing
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import IMAGE, body

Manifest = dict[str, Any]
NOW = "2026-11-29T12:00:00Z"


def queued(labels: dict[str, str] | None = None, **spec_fields: Any) -> spec.ServiceSpec:
    doc = body(**{"shardingPolicy": "DYNAMIC", "workers": {"replicas": 2}, **spec_fields})
    doc["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a", **(labels or {})}
    return spec.parse(doc, IMAGE)


def workload(svc: spec.ServiceSpec, priority: int | None = None) -> Manifest:
    return builders.render_workload(svc, BuildSettings(), priority)


def live(svc: spec.ServiceSpec, *conditions: Manifest, admitted: Manifest | None = None) -> Manifest:
    """The Workload as Kueue left it: stored (uid, resourceVersion, generation), with these conditions."""
    found = copy.deepcopy(workload(svc))
    found["metadata"].update(uid="wl-uid", resourceVersion="41", generation=1)
    found["status"] = {"conditions": list(conditions)}
    if admitted is not None:
        found["status"]["admission"] = admitted
    return found


def cond(kind: str, status: bool = True, reason: str = "", message: str = "") -> Manifest:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason or kind,
        "message": message,
        "lastTransitionTime": "2026-11-29T11:00:00Z",
    }


def admission(workers: int = 2, flavor: str = "default-flavor") -> Manifest:
    return {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {
                "name": "dispatcher",
                "flavors": {"cpu": flavor, "memory": flavor},
                "count": 1,
            },
            {
                "name": "workers",
                "flavors": {"cpu": flavor, "memory": flavor},
                "count": workers,
            },
        ],
    }


FLAVOR = {
    "metadata": {"name": "default-flavor"},
    "spec": {
        "nodeLabels": {"pool": "tfdata"},
        "tolerations": [{"key": "tfdata.dev/kueue", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def decide(
    svc: spec.ServiceSpec,
    found: Manifest | None,
    pods: int = 0,
    ready: bool = False,
    **kw: Any,
) -> Any:
    desired = workload(svc) if svc.kueue is not None else None
    flavors = kw.pop("flavors", {"default-flavor": FLAVOR})
    return queueing.decide(svc, desired, found, pods, ready, flavors, kw.pop("old", None), NOW, **kw)


# --- The Workload ---------------------------------------------------------------------------------


def test_the_workload_has_the_dispatcher_and_the_workers_as_pod_sets_owned_by_the_service() -> None:
    svc = queued()
    wl = workload(svc)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["metadata"]["name"].startswith("tfdataservice-demo-") and len(wl["metadata"]["name"]) == 24
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert wl["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    assert wl["spec"]["queueName"] == "team-a"
    (dispatcher, workers) = wl["spec"]["podSets"]
    assert (
        dispatcher["name"],
        dispatcher["count"],
        workers["name"],
        workers["count"],
    ) == (
        "dispatcher",
        1,
        "workers",
        2,
    )
    assert "minCount" not in workers and "priorityClassRef" not in wl["spec"]
    sts = {m["metadata"]["name"]: m for _, m in builders.render_statefulsets(svc, BuildSettings(), _counts(2))}
    assert workers["template"]["spec"] == sts["demo-worker"]["spec"]["template"]["spec"]
    assert set(workers["template"]["metadata"]) <= {"labels", "annotations"}
    # No Kueue label on what Kueue would otherwise take for a job of its own.
    for pod_set in wl["spec"]["podSets"]:
        assert not any(k.startswith(kueue.PREFIX) for k in pod_set["template"]["metadata"]["labels"])


def _counts(n: int) -> builders.Counts:
    return builders.Counts(dispatcher_workers=n, worker_replicas=n)


def test_an_autoscaled_service_asks_for_its_most_and_accepts_its_least() -> None:
    svc = queued(autoscaling={"minReplicas": 1, "maxReplicas": 4})
    (_, workers) = workload(svc)["spec"]["podSets"]
    assert (workers["count"], workers["minCount"]) == (4, 1)


def test_a_priority_class_is_named_with_its_value_and_a_new_service_gets_a_new_workload_name() -> None:
    svc = queued({kueue.PRIORITY_LABEL: "high"})
    wl = workload(svc, priority=1000)
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert wl["spec"]["priority"] == 1000
    other = spec.parse(
        {
            **body(shardingPolicy="DYNAMIC"),
            "metadata": {"name": "demo", "uid": "uid-2"},
        },
        IMAGE,
    )
    assert builders.workload_name(other) != builders.workload_name(svc)


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        (
            {kueue.QUEUE_LABEL: "Team_A"},
            "metadata.labels[kueue.x-k8s.io/queue-name] must name a Kueue object",
        ),
        ({kueue.PRIORITY_LABEL: "high"}, "needs kueue.x-k8s.io/queue-name"),
    ],
)
def test_bad_kueue_labels_are_refused_saying_which(labels: dict[str, str], said: str) -> None:
    doc = body(shardingPolicy="DYNAMIC")
    doc["metadata"]["labels"] = labels
    with pytest.raises(spec.SpecError, match=r"(?s).*" + said.replace("[", r"\[").replace("]", r"\]")):
        spec.parse(doc, IMAGE)


def test_kueue_labels_on_the_pods_are_refused_naming_the_label_to_use_instead() -> None:
    with pytest.raises(spec.SpecError) as refused:
        spec.parse(
            body(
                shardingPolicy="DYNAMIC",
                workers={"labels": {kueue.QUEUE_LABEL: "team-a"}},
            ),
            IMAGE,
        )
    assert "spec.workers.labels must not set kueue.x-k8s.io/queue-name" in str(refused.value)
    assert "label the TFDataService itself" in str(refused.value)


# --- Queued ---------------------------------------------------------------------------------------


def test_a_new_queued_service_writes_its_workload_and_runs_no_pod() -> None:
    svc = queued()
    decision = decide(svc, None)
    assert decision.state == queueing.QUEUED and decision.gated
    assert decision.apply == workload(svc)
    assert decision.events == [("Normal", reasons.KUEUE_QUEUED, decision.message)]
    effective = decision.effective_spec(svc)
    assert effective.suspend and effective.workers.replicas == 2
    assert decision.status is not None and decision.status["state"] == "Queued"


def test_while_pending_kueues_words_are_said_and_the_workload_is_rewritten_only_when_the_spec_changed() -> None:
    svc = queued()
    waiting = cond(
        kueue.QUOTA_RESERVED,
        False,
        "Pending",
        "couldn't assign flavors to pod set workers: insufficient quota",
    )
    decision = decide(
        svc,
        live(svc, waiting),
        old={"state": "Queued", "since": "2026-11-29T11:00:00Z"},
    )
    assert decision.state == queueing.QUEUED and decision.apply is None and decision.events == []
    assert "insufficient quota" in decision.message
    assert decision.status is not None and decision.status["since"] == "2026-11-29T11:00:00Z"
    bigger = queued(workers={"replicas": 3})
    assert decide(bigger, live(svc, waiting)).apply == workload(bigger)


# --- Admitted -------------------------------------------------------------------------------------


def test_an_admitted_service_runs_with_its_flavors_and_at_most_the_admitted_workers() -> None:
    svc = queued(workers={"replicas": 3, "nodeSelector": {"disk": "ssd"}})
    found = live(
        svc,
        cond(kueue.QUOTA_RESERVED),
        cond(kueue.ADMITTED),
        admitted=admission(workers=2),
    )
    decision = decide(svc, found, pods=0)
    assert decision.state == queueing.ADMITTED and not decision.gated
    assert decision.events[0][:2] == ("Normal", reasons.KUEUE_ADMITTED)
    assert "wants 3 workers, Kueue admitted 2" in decision.message
    effective = decision.effective_spec(svc)
    assert not effective.suspend and effective.workers.replicas == 2
    assert effective.workers.pod.node_selector == {"disk": "ssd", "pool": "tfdata"}
    assert effective.dispatcher.pod.node_selector == {"pool": "tfdata"}
    assert effective.workers.pod.tolerations == tuple(FLAVOR["spec"]["tolerations"])
    assert decision.status is not None and (
        decision.status["clusterQueue"],
        decision.status["admittedWorkers"],
    ) == (
        "cq",
        2,
    )
    assert decision.status_patch is not None  # not Ready yet: PodsReady False, WaitForStart
    (pods_ready,) = [c for c in decision.status_patch["status"]["conditions"] if c["type"] == "PodsReady"]
    assert (pods_ready["status"], pods_ready["reason"]) == ("False", "WaitForStart")


def test_the_autoscalers_ceiling_is_the_admitted_count() -> None:
    svc = queued(autoscaling={"minReplicas": 1, "maxReplicas": 4})
    found = live(
        svc,
        cond(kueue.QUOTA_RESERVED),
        cond(kueue.ADMITTED),
        admitted=admission(workers=2),
    )
    effective = decide(svc, found).effective_spec(svc)
    assert effective.autoscaling is not None and effective.autoscaling.max_replicas == 2


def test_ready_pods_are_said_to_kueue_once_with_the_workloads_resource_version() -> None:
    svc = queued()
    found = live(svc, cond(kueue.QUOTA_RESERVED), cond(kueue.ADMITTED), admitted=admission())
    patch = decide(svc, found, pods=3, ready=True).status_patch
    assert patch is not None and patch["metadata"] == {"resourceVersion": "41"}
    (ready,) = [c for c in patch["status"]["conditions"] if c["type"] == "PodsReady"]
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == ("True", "Started", NOW)
    assert len(patch["status"]["conditions"]) == 3  # Kueue's own kept
    found["status"]["conditions"].append(ready)
    assert decide(svc, found, pods=3, ready=True).status_patch is None


def pods_ready_after(found: Manifest, svc: spec.ServiceSpec, ready: bool) -> tuple[str, str, str] | None:
    """What the decision writes as PodsReady (status, reason, lastTransitionTime), kept on ``found``."""
    patch = decide(svc, found, pods=3, ready=ready).status_patch
    if patch is None:
        return None
    found["status"]["conditions"] = patch["status"]["conditions"]
    (c,) = [c for c in found["status"]["conditions"] if c["type"] == "PodsReady"]
    return c["status"], c["reason"], c["lastTransitionTime"]


def test_pods_ready_follows_the_pods_as_kueues_own_integrations_write_it() -> None:
    """Kueue's generatePodsReadyCondition: False WaitForStart until every pod is Ready, True Started,
    a pod lost after that False WaitForRecovery (its recoveryTimeout counts from that transition),
    True Recovered; each written once."""
    svc = queued()
    found = live(svc, cond(kueue.QUOTA_RESERVED), cond(kueue.ADMITTED), admitted=admission())
    assert pods_ready_after(found, svc, ready=False) == ("False", "WaitForStart", NOW)
    assert pods_ready_after(found, svc, ready=False) is None
    for c in found["status"]["conditions"]:
        c["lastTransitionTime"] = "2026-11-29T11:30:00Z"
    assert pods_ready_after(found, svc, ready=True) == ("True", "Started", NOW)
    assert pods_ready_after(found, svc, ready=True) is None
    (message,) = [c["message"] for c in found["status"]["conditions"] if c["type"] == "PodsReady"]
    assert message == "All pods reached readiness and the workload is running"
    assert pods_ready_after(found, svc, ready=False) == ("False", "WaitForRecovery", NOW)
    assert pods_ready_after(found, svc, ready=False) is None
    assert pods_ready_after(found, svc, ready=True) == ("True", "Recovered", NOW)
    assert pods_ready_after(found, svc, ready=True) is None
    # Lost again: waiting for recovery again, and Recovered once more after it.
    assert pods_ready_after(found, svc, ready=False) == ("False", "WaitForRecovery", NOW)
    assert pods_ready_after(found, svc, ready=True) == ("True", "Recovered", NOW)


def test_an_old_pods_ready_reason_is_brought_to_kueues_own() -> None:
    """A Workload whose PodsReady True has the reason this operator wrote before (``PodsReady``): the
    reason Kueue's integrations write now replaces it once, and a pod lost after that waits for recovery."""
    svc = queued()
    found = live(svc, cond(kueue.QUOTA_RESERVED), cond(kueue.ADMITTED), cond(kueue.PODS_READY), admitted=admission())
    assert pods_ready_after(found, svc, ready=True) == ("True", "Started", "2026-11-29T11:00:00Z")
    assert pods_ready_after(found, svc, ready=False) == ("False", "WaitForRecovery", NOW)


def test_an_admitted_flavor_that_cannot_be_read_runs_nothing_and_says_which() -> None:
    svc = queued()
    found = live(
        svc,
        cond(kueue.QUOTA_RESERVED),
        cond(kueue.ADMITTED),
        admitted=admission(flavor="gone"),
    )
    decision = decide(svc, found, flavors={"gone": None})
    assert decision.state == queueing.UNAVAILABLE and decision.gated and "gone" in decision.message


def test_an_edit_of_what_kueue_accounts_goes_through_the_queue_again_once_the_pods_stopped() -> None:
    svc = queued()
    found = live(svc, cond(kueue.QUOTA_RESERVED), cond(kueue.ADMITTED), admitted=admission())
    more = queued(workers={"replicas": 2, "resources": {"requests": {"cpu": "2"}}})
    decision = decide(more, found, pods=3)
    assert decision.state == queueing.REQUEUEING and decision.gated and not decision.immediate
    assert decision.delete is None and "workers containers' resources" in decision.message
    assert decide(more, found, pods=0).delete == "wl-uid"
    # An env or a worker count is no such edit: the count runs up to the admitted one.
    other = queued(workers={"replicas": 5, "env": [{"name": "A", "value": "1"}]})
    assert decide(other, found).state == queueing.ADMITTED


# --- Evicted --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reason", "requeued"), [("Preempted", "True"), ("ClusterQueueStopped", "False")])
def test_an_eviction_stops_every_pod_at_once_and_releases_the_quota_once_they_are_gone(
    reason: str, requeued: str
) -> None:
    svc = queued()
    evicted = cond(kueue.EVICTED, True, reason, "Preempted to accommodate a workload")
    found = live(
        svc,
        cond(kueue.QUOTA_RESERVED),
        cond(kueue.ADMITTED),
        evicted,
        admitted=admission(),
    )
    stopping = decide(svc, found, pods=3, old={"state": "Admitted"})
    assert stopping.state == queueing.EVICTED and stopping.gated and stopping.immediate
    assert stopping.status_patch is None and "once 3 pod(s) have stopped" in stopping.message
    assert stopping.events == [("Warning", reasons.KUEUE_EVICTED, stopping.message)]
    assert stopping.effective_spec(svc).workers.rescale_policy == spec.RESCALE_IMMEDIATE
    released = decide(svc, found, pods=0, old={"state": "Evicted"})
    patch = released.status_patch
    assert patch is not None and patch["metadata"] == {"resourceVersion": "41"}
    assert patch["status"]["admission"] is None
    by_type = {c["type"]: c for c in patch["status"]["conditions"]}
    assert (by_type["QuotaReserved"]["status"], by_type["QuotaReserved"]["reason"]) == (
        "False",
        "Pending",
    )
    assert (by_type["Admitted"]["status"], by_type["Admitted"]["reason"]) == (
        "False",
        "NoReservation",
    )
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == (
        requeued,
        reason,
    )
    assert by_type["Evicted"] == evicted  # Kueue's own, untouched
    # Released: still evicted (no pod) until Kueue admits it again, and nothing more to write.
    del found["status"]["admission"]
    assert decide(svc, found, pods=0).status_patch is None and decide(svc, found).gated


def test_admitted_again_it_runs_again() -> None:
    svc = queued()
    found = live(
        svc,
        cond(kueue.QUOTA_RESERVED),
        cond(kueue.ADMITTED),
        cond(kueue.EVICTED, False, "Preempted"),
        admitted=admission(),
    )
    decision = decide(svc, found, old={"state": "Evicted"})
    assert decision.state == queueing.ADMITTED and not decision.effective_spec(svc).suspend


# --- Suspended, finished, left ---------------------------------------------------------------------


def test_a_suspended_service_deletes_its_workload_once_its_pods_are_gone() -> None:
    svc = queued(suspend=True)
    found = live(svc, cond(kueue.QUOTA_RESERVED), cond(kueue.ADMITTED), admitted=admission())
    assert decide(svc, found, pods=2).delete is None
    decision = decide(svc, found, pods=0)
    assert decision.state == queueing.SUSPENDED and decision.delete == "wl-uid" and not decision.gated


def test_a_workload_kueue_finished_runs_nothing_and_says_how_to_queue_again() -> None:
    svc = queued()
    found = live(svc, cond(kueue.FINISHED, True, "FailedToStart", "node selector conflict"))
    decision = decide(svc, found)
    assert decision.state == queueing.FINISHED and decision.gated and "suspend and resume" in decision.message


def test_a_service_whose_label_was_removed_deletes_its_workload_and_runs_as_any_other() -> None:
    svc = spec.parse(body(shardingPolicy="DYNAMIC"), IMAGE)
    found = live(queued(), cond(kueue.QUOTA_RESERVED), admitted=admission())
    decision = queueing.decide(svc, None, found, 3, True, {}, {"state": "Admitted"}, NOW)
    assert decision.delete == "wl-uid" and decision.state is None and decision.status is None
    assert decision.events[0][1] == reasons.KUEUE_LEFT
    assert queueing.decide(svc, None, None, 3, True, {}, None, NOW) == queueing.Decision()
