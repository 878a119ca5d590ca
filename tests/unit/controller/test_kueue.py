"""The reconcile of a TFDataService labelled for a Kueue LocalQueue, against the in-memory API door:
the Workload written, no pod before admission, the admission's flavors in the pods, an eviction's
pods stopped at once and its quota released, and the operator without --kueue saying so."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import kueue, reasons
from tfdata_operator.controller import reconcile
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Observed, Outcome

from fixtures.fakes import FakeApi, service

Manifest = dict[str, Any]
CONFIG = OperatorConfig(server_image="tfdata-server:test", kueue=True)


def labelled(**spec: Any) -> Manifest:
    body = service(**spec)
    body["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a"}
    return body


def run(api: FakeApi, body: Manifest, config: OperatorConfig = CONFIG) -> Outcome:
    observed = api.observed()
    workloads = tuple(v for (kind, _), v in observed.objects.items() if kind == "Workload")
    children = {k: v for k, v in observed.objects.items() if k[0] not in ("Workload", "ResourceFlavor")}
    return reconcile.reconcile(
        api,
        config,
        {**body, "status": api.status},
        Observed(children, workloads=workloads),
    )


def the_workload(api: FakeApi) -> Manifest:
    (found,) = [v for (kind, _), v in api.objects.items() if kind == "Workload"]
    return found


def replicas(api: FakeApi) -> tuple[int, int]:
    return (
        api.objects[("StatefulSet", "demo-dispatcher")]["spec"]["replicas"],
        api.objects[("StatefulSet", "demo-worker")]["spec"]["replicas"],
    )


def ready_condition(api: FakeApi) -> Manifest:
    assert api.status is not None
    return next(c for c in api.status["conditions"] if c["type"] == "Ready")


def kueue_writes(api: FakeApi, state: str, workers: int = 2, **status: Any) -> None:
    """What Kueue's scheduler writes into the Workload's status."""
    wl = the_workload(api)
    conditions = [
        {
            "type": "QuotaReserved",
            "status": "True",
            "reason": "QuotaReserved",
            "message": "Quota reserved in ClusterQueue cq",
        },
        {
            "type": "Admitted",
            "status": "True",
            "reason": "Admitted",
            "message": "The workload is admitted",
        },
    ]
    if state == "Evicted":
        conditions.append(
            {
                "type": "Evicted",
                "status": "True",
                "reason": "Preempted",
                "message": "Preempted to accommodate a workload",
            }
        )
    flavors = {"cpu": "tfdata-flavor", "memory": "tfdata-flavor"}
    wl["status"] = {
        "conditions": [{**c, "lastTransitionTime": "2026-11-29T11:00:00Z"} for c in conditions],
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "dispatcher", "flavors": flavors, "count": 1},
                {"name": "workers", "flavors": flavors, "count": workers},
            ],
        },
        **status,
    }
    wl["metadata"]["resourceVersion"] = "500"
    api.objects[("ResourceFlavor", "tfdata-flavor")] = {
        "metadata": {"name": "tfdata-flavor"},
        "spec": {
            "nodeLabels": {"pool": "tfdata"},
            "tolerations": [{"key": "tfdata.dev/kueue", "operator": "Exists"}],
        },
    }


def test_a_queued_service_writes_its_workload_and_no_pod_runs_until_kueue_admits_it() -> None:
    api = FakeApi()
    run(api, labelled())
    wl = the_workload(api)
    assert wl["spec"]["queueName"] == "team-a" and [s["count"] for s in wl["spec"]["podSets"]] == [1, 2]
    assert replicas(api) == (0, 0)
    ready = ready_condition(api)
    assert (ready["status"], ready["reason"]) == ("False", reasons.KUEUE_QUEUED)
    assert api.status is not None and api.status["kueue"]["state"] == "Queued"
    assert not any(c["type"] == "Suspended" for c in api.status["conditions"])
    assert ("Normal", reasons.KUEUE_QUEUED, ready["message"]) in api.events
    # Once it is known to wait, nothing changes: nothing is written again.
    run(api, labelled())
    assert "Waiting for Kueue to admit Workload" in ready_condition(api)["message"]
    api.take_calls()
    run(api, labelled())
    assert [c for c in api.take_calls() if c[0] != "get"] == []


def test_admitted_the_pods_start_with_the_flavors_and_ready_pods_are_said_to_kueue() -> None:
    api = FakeApi()
    run(api, labelled(workers={"replicas": 3}))
    kueue_writes(api, "Admitted", workers=2)
    run(api, labelled(workers={"replicas": 3}))
    assert replicas(api) == (1, 2)
    pod = api.objects[("StatefulSet", "demo-worker")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["pool"] == "tfdata"
    assert {"key": "tfdata.dev/kueue", "operator": "Exists"} in pod["tolerations"]
    assert api.status is not None and api.status["kueue"]["admittedWorkers"] == 2
    assert "wants 3 workers, Kueue admitted 2" in api.status["kueue"]["message"]
    assert any(e[1] == reasons.KUEUE_ADMITTED for e in api.events)
    # The StatefulSets report every pod Ready: PodsReady goes to the Workload, once.
    for name, n in (("demo-dispatcher", 1), ("demo-worker", 2)):
        api.objects[("StatefulSet", name)]["status"] = {
            "replicas": n,
            "readyReplicas": n,
        }
    run(api, labelled(workers={"replicas": 3}))
    conditions = {c["type"]: c["status"] for c in the_workload(api)["status"]["conditions"]}
    assert conditions["PodsReady"] == "True" and conditions["Admitted"] == "True"
    api.take_calls()
    run(api, labelled(workers={"replicas": 3}))
    assert not [c for c in api.take_calls() if c[0] == "status" and c[1].startswith("Workload/")]


def test_an_eviction_stops_every_pod_at_once_and_the_quota_is_released_once_they_are_gone() -> None:
    api = FakeApi()
    run(api, labelled())
    kueue_writes(api, "Admitted")
    run(api, labelled())
    assert replicas(api) == (1, 2)
    kueue_writes(api, "Evicted")
    # Pods still there (a WhenIdle service whose readers cannot be asked would hold a suspend): gone at once.
    pods = [
        {
            "metadata": {
                "name": f"demo-worker-{i}",
                "labels": {"app.kubernetes.io/component": "worker"},
            }
        }
        for i in range(2)
    ]
    observed = api.observed()
    wl = tuple(v for (kind, _), v in observed.objects.items() if kind == "Workload")
    children = {k: v for k, v in observed.objects.items() if k[0] not in ("Workload", "ResourceFlavor")}
    reconcile.reconcile(
        api,
        CONFIG,
        {**labelled(), "status": api.status},
        Observed(children, pods, workloads=wl),
    )
    assert replicas(api) == (0, 0)
    assert "admission" in the_workload(api)["status"]  # released only once the pods are gone
    ready = ready_condition(api)
    assert (ready["status"], ready["reason"]) == ("False", reasons.KUEUE_EVICTED)
    assert ("Warning", reasons.KUEUE_EVICTED) in [(e[0], e[1]) for e in api.events]
    run(api, labelled())
    wl_status = the_workload(api)["status"]
    assert "admission" not in wl_status
    by_type = {c["type"]: (c["status"], c["reason"]) for c in wl_status["conditions"]}
    assert by_type["QuotaReserved"] == ("False", "Pending") and by_type["Requeued"] == (
        "True",
        "Preempted",
    )
    # The journal claim's StatefulSet stays: admitted again, the same dispatcher starts on its journal.
    kueue_writes(api, "Admitted")
    run(api, labelled())
    assert replicas(api) == (1, 2)


def test_a_stale_workload_is_read_again_not_overwritten() -> None:
    api = FakeApi()
    run(api, labelled())
    kueue_writes(api, "Evicted")
    body = labelled()
    observed = api.observed()
    stale = copy.deepcopy(the_workload(api))
    stale["metadata"]["resourceVersion"] = "499"
    children = {k: v for k, v in observed.objects.items() if k[0] not in ("Workload", "ResourceFlavor")}
    outcome = reconcile.reconcile(
        api,
        CONFIG,
        {**body, "status": api.status},
        Observed(children, workloads=(stale,)),
    )
    assert outcome.requeue_after is not None and outcome.requeue_after <= 1.0
    assert "admission" in the_workload(api)["status"]


def test_without_kueue_installed_the_service_says_so_and_runs_nothing() -> None:
    api = FakeApi()
    api.refuse[("Workload", "tfdataservice-demo-0f7ff")] = ApiException(status=404, reason="Not Found")
    outcome = run(api, labelled())
    assert outcome.retry
    assert replicas(api) == (0, 0)
    ready = ready_condition(api)
    assert ready["reason"] == reasons.KUEUE_UNAVAILABLE and "is Kueue installed?" in ready["message"]


def test_an_operator_without_kueue_runs_no_pod_of_a_queued_service_and_says_how_to_turn_it_on() -> None:
    api = FakeApi()
    run(api, labelled(), OperatorConfig(server_image="tfdata-server:test"))
    assert not [k for k in api.objects if k[0] == "Workload"]
    assert replicas(api) == (0, 0)
    ready = ready_condition(api)
    assert ready["reason"] == reasons.KUEUE_UNAVAILABLE and "kueue.enabled=true" in ready["message"]
    assert [e[1] for e in api.events].count(reasons.KUEUE_UNAVAILABLE) == 1
    run(api, labelled(), OperatorConfig(server_image="tfdata-server:test"))
    assert [e[1] for e in api.events].count(reasons.KUEUE_UNAVAILABLE) == 1
