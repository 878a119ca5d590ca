"""TFDataServices admitted through Kueue (issue 39, item 3): Kueue v0.19.2, built here from its Go
module (kind/kueue.sh), installed for this module only, and the chart's operator with kueue.enabled
(kind/cluster.sh), which the module turns off before it uninstalls Kueue, as docs/training-runs.md
says to.

A ClusterQueue with room for one service: the first is admitted and no pod of it exists before
its admission, carrying the flavor's node labels and toleration; the second waits, no pod, until
the first is deleted. Then the ClusterQueue is stopped (HoldAndDrain): Kueue evicts the service,
its pods stop, the operator releases the quota; started again, Kueue admits it again and it is
Ready on the same journal claim. Each wait prints how long it took.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kindpods import SERVER_IMAGE, wait_ready
from podhealth import OPERATOR_NAMESPACE

from tfdata_operator.api import kueue, spec
from tfdata_operator.api.quantity import parse_quantity
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.manifests import API_VERSION
from fixtures.support import ROOT, Kubectl, holds_for, wait_for

pytestmark = pytest.mark.kind

CLUSTER_QUEUE = "tfdata-room-for-one"
FLAVOR = "tfdata-flavor"
QUEUE = "tfdata-queue"
# The default LocalQueue's ClusterQueue: room for any pod of the last case.
ROOMY = "tfdata-roomy"
TOLERATION = {"key": "tfdata.dev/kueue-test", "operator": "Exists", "effect": "NoSchedule"}
# Kueue's own default Configuration, with TFDataService made a kind it knows (docs/training-runs.md).
KUEUE_CONFIG = """\
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
metrics:
  bindAddress: :8443
webhook:
  port: 9443
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
integrations:
  frameworks: ["batch/job", "jobset.x-k8s.io/jobset", "pod", "deployment", "statefulset"]
  externalFrameworks: ["TFDataService.v1alpha1.tfdata.dev"]
"""
KUEUE_READS_SERVICES = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "kueue-reads-tfdataservices"},
        "rules": [{"apiGroups": ["tfdata.dev"], "resources": ["tfdataservices"], "verbs": ["get", "list", "watch"]}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kueue-reads-tfdataservices"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "kueue-reads-tfdataservices",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}],
    },
]
TIMEOUT = 300


def queued_service(name: str) -> dict[str, Any]:
    """A small DYNAMIC service in the LocalQueue: one worker."""
    return {
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "metadata": {"name": name, "labels": {kueue.QUEUE_LABEL: QUEUE}},
        "spec": {
            "shardingPolicy": "DYNAMIC",
            "dispatcher": {"faultTolerantMode": True, "storage": {"size": "1Gi"}},
            "workers": {
                "replicas": 1,
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
            },
        },
    }


def requests_of(name: str, namespace: str) -> dict[str, float]:
    """What one service's Workload asks for in all, rendered as the operator renders it."""
    body = {**queued_service(name), "metadata": {**queued_service(name)["metadata"], "namespace": namespace}}
    svc = spec.parse(body, SERVER_IMAGE)
    total: dict[str, float] = {}
    for pod_set in builders.render_workload(svc, BuildSettings())["spec"]["podSets"]:
        pod = pod_set["template"]["spec"]
        for container in pod["containers"]:
            for resource, value in ((container.get("resources") or {}).get("requests") or {}).items():
                total[resource] = total.get(resource, 0.0) + pod_set["count"] * parse_quantity(value)
    return total


def operator_with_kueue(kubectl: Kubectl, enabled: bool) -> None:
    """The in-cluster operator's release (kind/cluster.sh) upgraded with ``kueue.enabled``, its other
    values kept, and rolled out."""
    started = time.monotonic()
    result = subprocess.run(
        [str(kubectl.binary.parent / "helm"), "upgrade", "tfdata-operator", str(ROOT / "charts" / "tfdata-operator"),
         "-n", OPERATOR_NAMESPACE, "--reuse-values", "--set", f"kueue.enabled={str(enabled).lower()}",
         "--wait", "--timeout", "3m"],
        env=kubectl.env, capture_output=True, text=True, timeout=200, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"helm upgrade with kueue.enabled={enabled} failed:\n{result.stderr[-4000:]}"
    kubectl.run("rollout", "status", "deployment", "-n", OPERATOR_NAMESPACE, "--timeout=180s", timeout=190)
    print(f"\nthe operator with kueue.enabled={enabled}: rolled out in {time.monotonic() - started:.0f}s")


def kueue_sh(*args: str, config: Path | None = None) -> None:
    env = {**os.environ}
    if config is not None:
        env["KUEUE_CONFIG"] = str(config)
    started = time.monotonic()
    result = subprocess.run(
        [str(ROOT / "kind" / "kueue.sh"), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, f"kind/kueue.sh {' '.join(args)} failed:\n{result.stderr[-4000:]}"
    print(f"\nkind/kueue.sh {args[0]}: {time.monotonic() - started:.0f}s")


@pytest.fixture(scope="module")
def queue(kubectl: Kubectl, namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Kueue installed, a ClusterQueue with room for one service, and its LocalQueue in the namespace;
    everything deleted after the module (Kueue too: its webhooks would see every later pod)."""
    config = tmp_path_factory.mktemp("kueue") / "config.yaml"
    config.write_text(KUEUE_CONFIG)
    kubectl.run(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": KUEUE_READS_SERVICES})
    )
    kueue_sh("install", config=config)
    operator_with_kueue(kubectl, enabled=True)  # as kind/cluster.sh installs it (an earlier run turned it off)
    one = requests_of("probe", namespace)
    quota = {r: _quantity(1.5 * v, r) for r, v in one.items()}
    objects = [
        {
            "apiVersion": kueue.WORKLOAD_API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": {"kubernetes.io/os": "linux"}, "tolerations": [TOLERATION]},
        },
        {
            "apiVersion": kueue.WORKLOAD_API_VERSION,
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": sorted(quota),
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [{"name": r, "nominalQuota": q} for r, q in sorted(quota.items())],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": kueue.WORKLOAD_API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    ]
    print(f"\none service asks for {one}; the ClusterQueue holds {quota}")
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    yield namespace
    kubectl.run("delete", "tfdata", "--all", "-n", namespace, "--wait=true", "--timeout=120s", timeout=130, check=False)
    for kind, name in (("localqueue", QUEUE), ("clusterqueue", CLUSTER_QUEUE), ("resourceflavor", FLAVOR)):
        kubectl.run(
            "delete", kind, name, "-n", namespace, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False
        )
    # As docs/training-runs.md says: the operator stops watching Workloads before Kueue's CRDs go. A
    # watched kind's CRD deleted under kopf stops the whole operator (its watch refused, 404), once.
    operator_with_kueue(kubectl, enabled=False)
    kueue_sh("uninstall")
    kubectl.run(
        "delete",
        "-f",
        "-",
        "--ignore-not-found",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": KUEUE_READS_SERVICES}),
    )


def _quantity(value: float, resource: str) -> str:
    return f"{int(value * 1000)}m" if resource == "cpu" else str(int(value))


def workload(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    found = kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")
    items = found.get("items") or []
    return items[0] if items else None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def pods_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")
    return list(listed.get("items") or [])


def service(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return kubectl.json("get", f"tfdata/{name}", "-n", namespace)


def state(kubectl: Kubectl, namespace: str, name: str) -> str:
    return str((service(kubectl, namespace, name).get("status") or {}).get("kueue", {}).get("state"))


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_a_queued_service_starts_only_once_admitted_and_a_second_waits_for_the_first_to_go(
    kubectl: Kubectl, queue: str
) -> None:
    namespace = queue
    created = time.monotonic()
    kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(queued_service("first")))
    wl = wait_for(
        lambda: (w := workload(kubectl, namespace, "first")) and condition(w, "Admitted").get("status") == "True" and w,
        TIMEOUT,
        "the first service's Workload admitted",
        interval=1,
        show=lambda: kubectl.run("get", "workloads,tfdata,pods", "-n", namespace, "-o", "wide", check=False).stdout,
    )
    admitted_after = time.monotonic() - created
    assert [s["count"] for s in wl["spec"]["podSets"]] == [1, 1]
    wait_ready(kubectl, namespace, "first", TIMEOUT)
    ready_after = time.monotonic() - created
    admitted_at = when(condition(wl, "Admitted")["lastTransitionTime"])
    pods = pods_of(kubectl, namespace, "first")
    assert len(pods) == 2
    for pod in pods:
        # Seconds resolution on both sides: no pod was made before the second Kueue admitted it.
        assert when(pod["metadata"]["creationTimestamp"]) >= admitted_at, pod["metadata"]["name"]
        assert pod["spec"]["nodeSelector"]["kubernetes.io/os"] == "linux"
        assert TOLERATION in pod["spec"]["tolerations"]
        assert not any(k.startswith(kueue.PREFIX) for k in pod["metadata"].get("labels", {}))
    status = service(kubectl, namespace, "first")["status"]["kueue"]
    assert (status["state"], status["clusterQueue"], status["admittedWorkers"]) == ("Admitted", CLUSTER_QUEUE, 1)
    print(f"\nfirst: admitted {admitted_after:.1f}s after it was applied, Ready after {ready_after:.1f}s")

    # PodsReady on the Workload follows the pods as Kueue's own integrations write it: a worker lost after
    # the start is WaitForRecovery (what Kueue's recoveryTimeout counts from), then Recovered.
    def pods_ready() -> tuple[str, str]:
        c = condition(workload(kubectl, namespace, "first"), "PodsReady")
        return str(c.get("status")), str(c.get("reason"))

    wait_for(pods_ready, 60, "PodsReady True (Started) on the first Workload", interval=1,
             until=lambda seen: seen == ("True", "Started"))  # fmt: skip
    lost = time.monotonic()
    kubectl.run("delete", "pod", "first-worker-0", "-n", namespace, "--wait=false")
    seen: list[tuple[str, str]] = []

    def recorded() -> tuple[str, str]:
        now = pods_ready()
        if not seen or seen[-1] != now:
            seen.append(now)
        return now

    wait_for(recorded, TIMEOUT, "PodsReady False (WaitForRecovery), then True (Recovered)", interval=0.5,
             until=lambda now: now == ("True", "Recovered"), show=lambda: seen)  # fmt: skip
    assert ("False", "WaitForRecovery") in seen, seen
    print(f"first: a worker deleted; PodsReady went {seen} in {time.monotonic() - lost:.1f}s")

    kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(queued_service("second")))

    def waits() -> tuple[str, int, str]:
        return (
            state(kubectl, namespace, "second"),
            len(pods_of(kubectl, namespace, "second")),
            str(condition(workload(kubectl, namespace, "second"), "QuotaReserved").get("status", "absent")),
        )

    def queued(seen: tuple[str, int, str]) -> bool:
        return seen[0] == "Queued" and seen[1] == 0 and seen[2] != "True"

    # The operator writes the Workload, then the service's status once Kueue has looked at it: the
    # hold starts from the first reading that says Queued (until then, no pod either).
    wait_for(waits, 60, "the second service queued (its Workload written, its status saying so)", until=queued)
    holds_for(waits, 20, "the second service queued without a pod", ok=queued)
    ready = next(c for c in service(kubectl, namespace, "second")["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "KueueQueued", ready
    print(f"\nsecond, while the first runs: {ready['message']}")

    deleted = time.monotonic()
    kubectl.run("delete", "tfdata/first", "-n", namespace, "--wait=false")
    wait_ready(kubectl, namespace, "second", TIMEOUT)
    print(f"\nsecond: Ready {time.monotonic() - deleted:.1f}s after the first was deleted")


def journal_claim(kubectl: Kubectl, namespace: str, name: str) -> str:
    """The uid of the service's dispatcher journal claim."""
    claims = kubectl.json("get", "pvc", "-n", namespace)["items"]
    (claim,) = [c for c in claims if c["metadata"]["name"].startswith(f"journal-{name}-dispatcher")]
    return str(claim["metadata"]["uid"])


def admission_released(
    kubectl: Kubectl, namespace: str, name: str, reason: str, status: str
) -> Callable[[], dict[str, Any] | None]:
    """A check for ``wait_for``: the service's Workload, once Kueue took its admission away (its
    condition ``reason`` has ``status``: QuotaReserved False after an eviction, Preempted True after
    a preemption), no pod of the service is left and the admission is cleared (the quota released)."""

    def check() -> dict[str, Any] | None:
        wl = workload(kubectl, namespace, name)
        free = wl is not None and "admission" not in (wl.get("status") or {})
        gone = not pods_of(kubectl, namespace, name)
        return wl if free and gone and condition(wl, reason).get("status") == status else None

    return check


def test_an_eviction_suspends_the_service_and_its_readmission_resumes_it_on_the_same_journal(
    kubectl: Kubectl, queue: str
) -> None:
    namespace = queue
    wait_ready(kubectl, namespace, "second", TIMEOUT)
    claim = journal_claim(kubectl, namespace, "second")

    stopped = time.monotonic()
    kubectl.run("patch", "clusterqueue", CLUSTER_QUEUE, "--type=merge", "-p", '{"spec":{"stopPolicy":"HoldAndDrain"}}')
    wl = wait_for(
        admission_released(kubectl, namespace, "second", "QuotaReserved", "False"),
        TIMEOUT,
        "the evicted service's pods gone and its quota released",
        interval=1,
        show=lambda: kubectl.run("get", "workloads,tfdata,pods", "-n", namespace, "-o", "yaml", check=False).stdout[
            -6000:
        ],
    )
    evicted = condition(wl, "Evicted")
    assert (evicted.get("status"), evicted.get("reason")) == ("True", "ClusterQueueStopped"), evicted
    body = service(kubectl, namespace, "second")
    assert body["status"]["kueue"]["state"] == "Evicted"
    assert next(c for c in body["status"]["conditions"] if c["type"] == "Ready")["reason"] == "KueueEvicted"
    print(f"\nevicted: pods gone and quota released {time.monotonic() - stopped:.1f}s after the ClusterQueue stopped")
    assert journal_claim(kubectl, namespace, "second") == claim, "the evicted service's journal claim must stay"

    restarted = time.monotonic()
    kubectl.run("patch", "clusterqueue", CLUSTER_QUEUE, "--type=merge", "-p", '{"spec":{"stopPolicy":"None"}}')
    wait_ready(kubectl, namespace, "second", TIMEOUT)
    assert journal_claim(kubectl, namespace, "second") == claim, "the dispatcher must start again on its journal"
    print(f"\nadmitted again and Ready {time.monotonic() - restarted:.1f}s after the ClusterQueue started again")


def test_a_higher_priority_service_preempts_a_lower_one_which_resumes_on_its_journal_once_it_goes(
    kubectl: Kubectl, queue: str
) -> None:
    """Priority through Kueue's WorkloadPriorityClass label: with room for one service and preemption
    within the ClusterQueue, a high-priority service evicts a running low-priority one (Kueue's
    reason Preempted): the low one's pods stop, its quota is released and it queues again (journal
    claim kept); once the high one is deleted, the low one is admitted again and resumes on the same
    journal claim."""
    namespace = queue
    kubectl.run("delete", "tfdata/second", "-n", namespace, "--ignore-not-found", "--wait=true", "--timeout=120s",
                timeout=130)  # fmt: skip
    wait_for(lambda: workload(kubectl, namespace, "second") is None, TIMEOUT, "the second service's Workload gone")
    classes = [
        {"apiVersion": kueue.WORKLOAD_API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": n}, "value": v}
        for n, v in (("tfdata-low", 10), ("tfdata-high", 1000))
    ]
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": classes}))
    preempting = {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}}
    kubectl.run("patch", "clusterqueue", CLUSTER_QUEUE, "--type=merge", "-p", json.dumps(preempting))

    def prioritised(name: str, priority: str) -> dict[str, Any]:
        body = queued_service(name)
        body["metadata"]["labels"][kueue.PRIORITY_LABEL] = priority
        return body

    try:
        kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(prioritised("low", "tfdata-low")))
        wait_ready(kubectl, namespace, "low", TIMEOUT)
        claim = journal_claim(kubectl, namespace, "low")
        assert workload(kubectl, namespace, "low")["spec"]["priority"] == 10

        started = time.monotonic()
        kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(prioritised("high", "tfdata-high")))

        wl = wait_for(
            admission_released(kubectl, namespace, "low", "Preempted", "True"),
            TIMEOUT,
            "the low-priority service preempted: its pods gone and its quota released",
            interval=1,
            show=lambda: kubectl.run("get", "workloads,tfdata,pods", "-n", namespace, "-o", "wide", check=False).stdout,
        )
        evicted = condition(wl, "Evicted")
        assert (evicted.get("status"), evicted.get("reason")) == ("True", "Preempted"), evicted
        released = time.monotonic() - started
        wait_ready(kubectl, namespace, "high", TIMEOUT)
        high_ready = time.monotonic() - started
        low = service(kubectl, namespace, "low")["status"]
        ready = next(c for c in low["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False", ready
        assert journal_claim(kubectl, namespace, "low") == claim, "the preempted service's journal claim must stay"
        print(
            f"\nlow preempted: pods gone and quota released {released:.1f}s after the high one was applied, "
            f"the high one Ready after {high_ready:.1f}s; low says {low['kueue']['state']}: {ready['message']}"
        )

        deleted = time.monotonic()
        kubectl.run("delete", "tfdata/high", "-n", namespace, "--wait=false")
        wait_ready(kubectl, namespace, "low", TIMEOUT)
        assert journal_claim(kubectl, namespace, "low") == claim, "the dispatcher must start again on its journal"
        print(f"low: admitted again and Ready {time.monotonic() - deleted:.1f}s after the high one was deleted")
    finally:
        for name in ("high", "low"):
            kubectl.run("delete", f"tfdata/{name}", "-n", namespace, "--ignore-not-found", "--wait=true",
                        "--timeout=120s", timeout=130, check=False)  # fmt: skip
        kubectl.run("patch", "clusterqueue", CLUSTER_QUEUE, "--type=merge", "-p", '{"spec":{"preemption":null}}',
                    check=False)  # fmt: skip
        kubectl.run("delete", "workloadpriorityclass", "tfdata-low", "tfdata-high", "--ignore-not-found", check=False)


def test_a_default_local_queue_leaves_an_unlabelled_service_alone_and_it_scales(kubectl: Kubectl, queue: str) -> None:
    """A namespace with a LocalQueue named ``default`` (Kueue's queue defaulting), with TFDataService
    registered as an external framework (the module's Kueue Configuration): an unlabelled service's
    StatefulSets are not claimed (no queue label, no Workload of theirs), and a change of the worker
    count, the write the TFData autoscaler makes too, reaches the workers. Without the registration
    Kueue's webhook claims them and refuses such a change (docs/training-runs.md). Kueue's pod
    integration still queues each pod on its own (as that page says), so the default LocalQueue's
    ClusterQueue has room for them. A service labelled for that queue is admitted whole instead: one
    Workload of its own, and no pod queued on its own."""
    namespace = queue
    roomy = {
        "apiVersion": kueue.WORKLOAD_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": ROOMY},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "ephemeral-storage"],
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "100"},
                                {"name": "memory", "nominalQuota": "1000Gi"},
                                {"name": "ephemeral-storage", "nominalQuota": "1000Gi"},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    default = {
        "apiVersion": kueue.WORKLOAD_API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"clusterQueue": ROOMY},
    }
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [roomy, default]}))
    free = queued_service("free")
    del free["metadata"]["labels"]
    try:
        kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(free))
        wait_ready(kubectl, namespace, "free", TIMEOUT)
        for part in ("dispatcher", "worker"):
            labels = kubectl.json("get", "statefulset", f"free-{part}", "-n", namespace)["metadata"].get("labels", {})
            assert kueue.QUEUE_LABEL not in labels, (part, labels)
        names = [
            w["metadata"]["name"] for w in kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
        ]
        # Kueue's StatefulSet integration would make one of each StatefulSet ("statefulset-free-…"); its
        # pod integration makes one per pod ("pod-free-…"), as docs/training-runs.md says.
        assert not [n for n in names if n.startswith("statefulset-")], names
        print(f"\nfree: Kueue's Workloads in the namespace: {names}")

        scaled = time.monotonic()
        kubectl.run("scale", "tfdata/free", "-n", namespace, "--replicas=2")

        def workers() -> tuple[int, str]:
            sts = kubectl.json("get", "statefulset", "free-worker", "-n", namespace)
            ready = next(c for c in service(kubectl, namespace, "free")["status"]["conditions"] if c["type"] == "Ready")
            return int((sts.get("status") or {}).get("readyReplicas") or 0), str(ready.get("reason"))

        seen = wait_for(
            workers,
            TIMEOUT,
            "2 ready workers of the unlabelled service",
            interval=1,
            until=lambda w: w[0] == 2 or w[1] == "ChildRefusedByAdmission",
        )
        assert seen[0] == 2, f"the worker count did not reach the workers: {seen}"
        print(f"\nfree (a default LocalQueue in its namespace): 2 workers ready {time.monotonic() - scaled:.1f}s later")

        # Labelled for that queue, a service is admitted whole, as one Workload of its own: its pods have a
        # queued owner, and Kueue's pod integration leaves them alone (docs/training-runs.md).
        whole = queued_service("whole")
        whole["metadata"]["labels"][kueue.QUEUE_LABEL] = "default"
        kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(whole))
        wait_ready(kubectl, namespace, "whole", TIMEOUT)
        names = [
            w["metadata"]["name"] for w in kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
        ]
        assert [n for n in names if n.startswith("tfdataservice-whole-")], names
        assert not [n for n in names if n.startswith(("pod-whole-", "statefulset-whole-"))], names
        for pod in pods_of(kubectl, namespace, "whole"):
            assert not any(k.startswith(kueue.PREFIX) for k in pod["metadata"].get("labels", {})), pod["metadata"]
        print(f"whole (labelled default): one Workload; the namespace's Workloads: {names}")
    finally:
        for name in ("free", "whole"):
            kubectl.run("delete", f"tfdata/{name}", "-n", namespace, "--ignore-not-found", "--wait=true",
                        "--timeout=120s", timeout=130, check=False)  # fmt: skip
        kubectl.run(
            "delete", "localqueue", "default", "-n", namespace, "--ignore-not-found", "--wait=true", check=False
        )
        kubectl.run("delete", "clusterqueue", ROOMY, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
