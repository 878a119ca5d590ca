"""The Kueue Workload of a queued TFDataService (``render/workload.py``): where it lives, what its pod sets
ask for, and the priority class it names."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tfdata_operator.api import kueue, spec
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import IMAGE, OWNER, body

Manifest = dict[str, Any]


def queued(labels: dict[str, str] | None = None, **spec_fields: Any) -> spec.ServiceSpec:
    doc = body(**{"shardingPolicy": "DYNAMIC", "workers": {"replicas": 2}, **spec_fields})
    doc["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a", **(labels or {})}
    return spec.parse(doc, IMAGE)


def templates(svc: spec.ServiceSpec, settings: BuildSettings) -> tuple[Manifest, Manifest]:
    """The dispatcher's and the workers' pod templates, as their StatefulSets run them."""
    dispatcher = builders.build_dispatcher_statefulset(svc, settings, 2)["spec"]["template"]
    workers = builders.build_worker_statefulset(svc, settings, 2)["spec"]["template"]
    return dispatcher, workers


def test_the_workload_is_in_the_services_namespace_labelled_like_its_children_and_owned_by_it(
    settings: BuildSettings,
) -> None:
    svc = queued()
    wl = builders.build_workload(svc, *templates(svc, settings))
    assert wl["metadata"] == {
        "name": builders.workload_name(svc),
        "namespace": "ml",
        "labels": {
            "app.kubernetes.io/name": "tfdata-service",
            "app.kubernetes.io/instance": "demo",
            "app.kubernetes.io/managed-by": "tfdata-operator",
        },
        "ownerReferences": [OWNER],
    }


@pytest.mark.parametrize(
    ("least", "most", "min_count"),
    [
        (1, 4, 1),
        (0, 4, 1),  # a service that may scale to zero: a pod set accepts no fewer than one pod
        (3, 3, None),  # nothing fewer to admit: the pod set asks for exactly its count
    ],
)
def test_an_autoscaled_service_asks_for_its_most_and_accepts_its_least_when_that_is_fewer(
    settings: BuildSettings, least: int, most: int, min_count: int | None
) -> None:
    svc = queued(autoscaling={"metric": "TFData", "minReplicas": least, "maxReplicas": most})
    (_, workers) = builders.build_workload(svc, *templates(svc, settings))["spec"]["podSets"]
    assert (workers["count"], workers.get("minCount")) == (most, min_count)


@pytest.mark.parametrize(
    ("labels", "priority"),
    [
        # The class's value could not be read (the reconcile says why and writes no Workload).
        ({kueue.PRIORITY_LABEL: "high"}, None),
        # A value without a class to name: nothing to refer to.
        ({}, 1000),
    ],
)
def test_a_priority_class_is_named_only_with_its_value(
    settings: BuildSettings, labels: dict[str, str], priority: int | None
) -> None:
    svc = queued(labels)
    wl = builders.build_workload(svc, *templates(svc, settings), priority)
    assert "priorityClassRef" not in wl["spec"] and "priority" not in wl["spec"]


def test_each_pod_set_takes_its_pod_template_with_only_the_labels_and_annotations_of_its_metadata(
    settings: BuildSettings,
) -> None:
    svc = queued(workers={"replicas": 2, "annotations": {"team.example/cost-center": "ml"}})
    dispatcher, workers = templates(svc, settings)
    # Anything else in a template's metadata stays with the StatefulSet (a name, say).
    dispatcher["metadata"]["name"] = workers["metadata"]["name"] = "a-pod"
    sets = builders.build_workload(svc, dispatcher, workers)["spec"]["podSets"]
    for pod_set, template in zip(sets, (dispatcher, workers), strict=True):
        assert pod_set["template"] == {
            "metadata": {"labels": template["metadata"]["labels"], "annotations": template["metadata"]["annotations"]},
            "spec": template["spec"],
        }
    assert sets[1]["template"]["metadata"]["annotations"]["team.example/cost-center"] == "ml"


def test_the_workload_shares_nothing_with_the_templates_it_was_built_from(settings: BuildSettings) -> None:
    svc = queued()
    dispatcher, workers = templates(svc, settings)
    wl = builders.build_workload(svc, dispatcher, workers)
    written = copy.deepcopy(wl)
    # What a caller may go on doing with its StatefulSets' templates (Kueue's flavors merged in).
    for template in (dispatcher, workers):
        template["spec"]["nodeSelector"] = {"pool": "tfdata"}
        template["spec"]["containers"][0]["image"] = "other:1"
        template["metadata"]["labels"]["extra"] = "x"
    assert wl == written
