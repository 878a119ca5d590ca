"""The pure parts of a reconcile: deciding what to apply and what to delete."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tfdata_operator.api import reasons
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import drain
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import parse

NONE = plan.Children("demo")


def test_new_service_gets_every_child_in_order() -> None:
    desired = plan.desired_children(parse(shardingPolicy="FILE"), BuildSettings(), NONE)
    kinds = [(m["kind"], m["metadata"]["name"]) for m in desired.apply]
    assert kinds == [
        ("Service", "demo-dispatcher"),
        ("Service", "demo-dispatcher-pods"),
        ("Service", "demo-worker"),
        ("ConfigMap", "demo-client"),
        ("StatefulSet", "demo-dispatcher"),
        ("StatefulSet", "demo-worker"),
        ("PodDisruptionBudget", "demo-worker"),
        ("NetworkPolicy", "demo"),
    ]
    assert desired.delete == [] and desired.waiting is None


def test_turning_the_network_policy_off_deletes_it() -> None:
    on = plan.desired_children(parse(), BuildSettings(), NONE)
    policy = next(m for m in on.apply if m["kind"] == "NetworkPolicy")
    children = plan.Children("demo", {("NetworkPolicy", "demo"): policy})
    off = plan.desired_children(parse(networkPolicy={"enabled": False}), BuildSettings(), children)
    assert off.delete == [("networking.k8s.io/v1", "NetworkPolicy", "demo")]


def test_autoscaling_adds_and_removes_the_hpa() -> None:
    auto = parse(
        shardingPolicy="DYNAMIC",
        workers={"resources": {"requests": {"cpu": "1"}}},
        autoscaling={"metric": "CPU", "maxReplicas": 4},
    )
    desired = plan.desired_children(auto, BuildSettings(), NONE)
    assert "HorizontalPodAutoscaler" in [m["kind"] for m in desired.apply]
    live_hpa = next(m for m in desired.apply if m["kind"] == "HorizontalPodAutoscaler")
    children = plan.Children("demo", {("HorizontalPodAutoscaler", "demo-worker"): live_hpa})
    removed = plan.desired_children(parse(shardingPolicy="DYNAMIC"), BuildSettings(), children)
    assert removed.delete == [("autoscaling/v2", "HorizontalPodAutoscaler", "demo-worker")]
    # Switching to the operator's own decisions removes the HPA too.
    tfdata = parse(shardingPolicy="DYNAMIC", autoscaling={"metric": "TFData", "maxReplicas": 4})
    assert plan.desired_children(tfdata, BuildSettings(), children).delete == removed.delete


def test_an_hpa_the_operator_does_not_own_is_left_alone() -> None:
    foreign = {
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "demo-worker", "ownerReferences": []},
    }
    children = plan.Children("demo", {("HorizontalPodAutoscaler", "demo-worker"): foreign})
    assert plan.desired_children(parse(), BuildSettings(), children).delete == []


def test_needs_apply_ignores_what_the_server_adds() -> None:
    desired = builders.build_worker_service(parse())
    live = {
        **desired,
        "metadata": {**desired["metadata"], "uid": "u", "resourceVersion": "7"},
        "spec": {**desired["spec"], "sessionAffinity": "None", "clusterIPs": ["None"]},
    }
    assert not plan.needs_apply(desired, live)
    edited = {**live, "spec": {**live["spec"], "publishNotReadyAddresses": False}}
    assert plan.needs_apply(desired, edited)
    assert plan.needs_apply(desired, None)


def test_needs_apply_ignores_what_the_server_adds_to_each_container() -> None:
    desired = builders.build_worker_statefulset(parse(), BuildSettings(), 2)
    live = copy.deepcopy(desired)
    containers = live["spec"]["template"]["spec"]["containers"]
    for container in containers:
        container.update(terminationMessagePath="/dev/termination-log", imagePullPolicy="IfNotPresent")
    assert not plan.needs_apply(desired, live)
    containers[0]["image"] = "tensorflow/tensorflow:2.15.0"
    assert plan.needs_apply(desired, live)


# --- The Event of each change --------------------------------------------------------------------


def _statefulsets(**spec: object) -> dict[str, dict[str, object]]:
    desired = plan.desired_children(parse(**spec), BuildSettings(), NONE)
    return {m["metadata"]["name"]: m for m in desired.apply if m["kind"] == "StatefulSet"}


def _event(before: dict[str, object], after: dict[str, object], name: str) -> tuple[str, str]:
    return plan.change_events(_statefulsets(**after)[name], _statefulsets(**before)[name])


@pytest.mark.parametrize(
    ("before", "after", "name", "reason", "says"),
    [
        pytest.param({}, {"workers": {"replicas": 3}}, "demo-worker", "Scaled",
                     "Scaled StatefulSet demo-worker from 2 to 3 replicas", id="dynamic-scale"),
        pytest.param({"shardingPolicy": "FILE"}, {"shardingPolicy": "FILE", "workers": {"replicas": 3}},
                     "demo-dispatcher", "RollingOut",
                     "Rolling out a new pod template to StatefulSet demo-dispatcher (its worker list changes from 2 "
                     "to 3 workers; the dispatcher restarts because it reads the list only when it starts)",
                     id="static-dispatcher-roll"),
        pytest.param({}, {"workers": {"replicas": 3, "resources": {"requests": {"cpu": "2"}}}}, "demo-worker",
                     "RollingOut",
                     "Rolling out a new pod template to StatefulSet demo-worker (spec.replicas, spec.template), "
                     "and scaling it from 2 to 3 replicas", id="roll-and-scale"),
        pytest.param({}, {"workers": {"resources": {"requests": {"cpu": "2"}}}}, "demo-worker", "RollingOut",
                     "Rolling out a new pod template to StatefulSet demo-worker (spec.template)", id="roll"),
        # A worker list only before or only after: no count to compare, the fields say it.
        pytest.param({"shardingPolicy": "FILE"}, {"shardingPolicy": "DYNAMIC"}, "demo-dispatcher", "RollingOut",
                     "Rolling out a new pod template to StatefulSet demo-dispatcher (spec.template)",
                     id="static-to-dynamic"),
        pytest.param({"shardingPolicy": "DYNAMIC"}, {"shardingPolicy": "FILE"}, "demo-dispatcher", "RollingOut",
                     "Rolling out a new pod template to StatefulSet demo-dispatcher (spec.template)",
                     id="dynamic-to-static"),
    ],
)  # fmt: skip
def test_every_change_of_a_statefulset_has_an_event_that_says_what_and_why(
    before: dict[str, object], after: dict[str, object], name: str, reason: str, says: str
) -> None:
    assert _event(before, after, name) == (reason, says)


def test_a_new_child_is_created_and_other_changes_are_updates() -> None:
    service = plan.desired_children(parse(), BuildSettings(), NONE).apply[0]
    assert plan.change_events(service, None) == ("Created", "Created Service demo-dispatcher")
    edited = {**service, "spec": {**service["spec"], "publishNotReadyAddresses": False}}
    updated = ("Updated", "Updated Service demo-dispatcher (spec.publishNotReadyAddresses)")
    assert plan.change_events(service, edited) == updated


def test_each_change_gets_an_event_that_names_what_changed() -> None:
    sts = {"kind": "StatefulSet", "metadata": {"name": "demo-worker"}, "spec": {"replicas": 2, "template": {"a": 1}}}
    assert plan.change_events(sts, None) == ("Created", "Created StatefulSet demo-worker")
    scaled = {**sts, "spec": {**sts["spec"], "replicas": 3}}
    assert plan.change_events(scaled, sts) == ("Scaled", "Scaled StatefulSet demo-worker from 2 to 3 replicas")
    rolled = {**sts, "spec": {**sts["spec"], "template": {"a": 2}}}
    assert plan.change_events(rolled, sts) == (
        "RollingOut",
        "Rolling out a new pod template to StatefulSet demo-worker (spec.template)",
    )
    labelled = {**sts, "metadata": {"name": "demo-worker", "labels": {"x": "y"}}}
    assert plan.change_events(labelled, sts) == ("Updated", "Updated StatefulSet demo-worker (metadata.labels)")
    service = {"kind": "Service", "metadata": {"name": "demo"}, "spec": {"ports": [1]}, "extra": 1}
    live = {"kind": "Service", "metadata": {"name": "demo"}, "spec": {"ports": [2]}}
    assert plan.change_events(service, live) == ("Updated", "Updated Service demo (spec.ports, extra)")
    assert plan.change_events(live, live) == ("Updated", "Updated Service demo (no field)")


def test_an_update_names_every_field_it_changes_and_what_a_live_object_lacks() -> None:
    desired = {
        "kind": "ConfigMap",
        "metadata": {"name": "c", "labels": {"a": "1"}},
        "spec": {"x": 1},
        "data": {"k": "v"},
    }
    live = {"kind": "ConfigMap", "metadata": {"name": "c"}, "spec": {"x": 2}}
    assert plan.change_events(desired, live) == ("Updated", "Updated ConfigMap c (metadata.labels, spec.x, data)")


def test_objects_and_pods_without_optional_fields() -> None:
    assert not plan.owned_by({}, "uid-1")
    assert plan.Children(name="demo", objects={}, pods=[{"metadata": {"name": "p"}}]).pods_of("worker") == []
    assert plan.needs_apply([1], None) and plan.needs_apply([1], [1, 2]) and not plan.needs_apply([1], [1])


def _budget(max_unavailable: int) -> dict[str, Any]:
    svc = parse(shardingPolicy="FILE")
    desired = plan.desired_children(svc, BuildSettings(), NONE, max_unavailable=max_unavailable)
    return next(m for m in desired.apply if m["kind"] == "PodDisruptionBudget")


# What the drain decision says while a client reads (plan/drain.py writes such sentences).
HELD = drain.DrainDecision(0, message="Drains wait: a client reads.", detail="1 clients attached to jobs")


def test_a_change_of_the_disruption_budget_is_told_with_why_drains_wait() -> None:
    assert plan.change_events(_budget(0), _budget(1), HELD) == (
        reasons.DRAINS_HELD,
        "PodDisruptionBudget demo-worker: maxUnavailable 0. Drains wait: a client reads. (1 clients attached to jobs)",
    )


def test_a_budget_whose_max_unavailable_stays_is_a_plain_update_whatever_the_drains() -> None:
    # A budget written before unhealthyPodEvictionPolicy was set: the update names that field.
    live = _budget(0)
    live["spec"] = {k: v for k, v in live["spec"].items() if k != "unhealthyPodEvictionPolicy"}
    assert plan.change_events(_budget(0), live, HELD) == (
        reasons.UPDATED,
        "Updated PodDisruptionBudget demo-worker (spec.unhealthyPodEvictionPolicy)",
    )
