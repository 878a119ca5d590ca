"""The operator as a real process against a real control plane, driven with kubectl like a user.

No kubelet runs in this cluster, so Pods stay Pending; where a test needs a ready Pod, it lets
the pod tolerate the taint of the cluster's kwok node, where kwok (a simulated kubelet) reports
it Running and Ready as a kubelet would.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
import yaml

from tfdata_operator.controller import faults
from tfdata_operator.plan import children

import devcluster
from fixtures.cases import (
    BAD_SPECS,
    EXAMPLES,
    HOST_PATH,
    REQUESTS_ABOVE_LIMITS,
    ROOT,
    BadSpec,
    expected_children,
    manifest,
)
from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, OperatorProcess, Watch, holds_for, kubelet_nodes, to_run, wait_for

# Longer than one resync (OperatorProcess sets TFDATA_RESYNC_SECONDS=5): a state that must hold
# is sampled through at least one reconcile.
HOLD_SECONDS = 6.0
CHILD_KINDS = ",".join(kind.plural for kind in children.CHILDREN)
# A service with the defaults: three Services, the client ConfigMap, two StatefulSets, a PodDisruptionBudget
# and a NetworkPolicy.
DEFAULT_CHILDREN = 8


class Cluster:
    """What the tests read and do in their namespace."""

    def __init__(self, kubectl: Kubectl, namespace: str, run_first: str | None) -> None:
        self.kubectl = kubectl
        self.ns = namespace
        # On a cluster with nodes (kind, through TFDATA_TEST_KUBECONFIG) kubelets run the pods.
        self.has_nodes = bool(kubelet_nodes(kubectl.json("get", "nodes")))
        self.run_first = run_first

    def run(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.kubectl.run(*args, "-n", self.ns, **kwargs)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object, or None when the API server says NotFound (any other error fails)."""
        return self.kubectl.get(kind, name, "-n", self.ns)  # type: ignore[no-any-return]

    def apply_text(self, text: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-f", "-", input=text, check=check)

    def service(self, name: str) -> dict[str, Any]:
        obj = self.get("tfdataservice", name)
        assert obj is not None, f"TFDataService {name} does not exist"
        return obj

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        conditions = (self.service(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), {})

    def children(self, instance: str) -> list[dict[str, Any]]:
        items = json.loads(
            self.run("get", CHILD_KINDS, "-l", f"app.kubernetes.io/instance={instance}", "-o", "json").stdout
        )["items"]
        return sorted(items, key=lambda o: (o["kind"], o["metadata"]["name"]))

    def worker_list(self, name: str) -> list[str] | None:
        sts = self.get("statefulset", f"{name}-dispatcher")
        if sts is None:
            return None
        env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
        return json.loads(env["TFDATA_SERVER_CONFIG"]).get("worker_addresses")

    def replicas(self, sts_name: str) -> int | None:
        sts = self.get("statefulset", sts_name)
        return sts["spec"]["replicas"] if sts else None

    def run_pods(self, name: str, *parts: str) -> None:
        """Makes the pods of `parts` ("dispatcher", "workers") of TFDataService `name` run (the
        operator replaces the Pending ones): on the dev cluster they move to the kwok node, where
        they turn Running and Ready; on kind they are placed before the pods of the other services
        this module applies, which do not all fit on the node (support.to_run)."""
        self.run("patch", "tfdata", name, "--type=merge", "-p", to_run(*parts, priority_class=self.run_first))

    def resource_versions(self, instance: str) -> dict[str, str]:
        versions = {
            f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in self.children(instance)
        }
        versions["TFDataService"] = self.service(instance)["metadata"]["resourceVersion"]
        return versions


@pytest.fixture(scope="module")
def k8s(kubectl: Kubectl, namespace: str, operator: OperatorProcess, run_first: str | None) -> Cluster:
    return Cluster(kubectl, namespace, run_first)


def example_names() -> list[str]:
    return [yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES]


def wait_reconciled(k8s: Cluster, name: str, timeout: float = 60) -> dict[str, Any]:
    def observed() -> dict[str, Any] | None:
        obj = k8s.service(name)
        status = obj.get("status") or {}
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and status.get("conditions") else None

    return wait_for(observed, timeout, f"{name} to be reconciled", show=lambda: k8s.service(name).get("status"))


def wait_children(k8s: Cluster, name: str, expected: set[tuple[str, str]]) -> list[dict[str, Any]]:
    def exactly_expected() -> list[dict[str, Any]] | None:
        children = k8s.children(name)
        return children if {(o["kind"], o["metadata"]["name"]) for o in children} == expected else None

    return wait_for(
        exactly_expected,
        30,
        f"the children of {name}",
        show=lambda: [(o["kind"], o["metadata"]["name"]) for o in k8s.children(name)],
    )


# --- Examples, status, printer columns, explain, wait ------------------------------------------


def test_every_example_gets_its_children_and_status(k8s: Cluster) -> None:
    for path in EXAMPLES:
        k8s.run("apply", "-f", str(path))
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        name = doc["metadata"]["name"]
        obj = wait_reconciled(k8s, name)
        uid = obj["metadata"]["uid"]
        expected = expected_children(doc)
        children = wait_children(k8s, name, expected)
        for child in children:
            (ref,) = child["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("TFDataService", name, uid, True)
        status = obj["status"]
        assert status["dispatcherAddress"] == f"grpc://{name}-dispatcher.{k8s.ns}.svc.cluster.local:5050"
        assert {c["type"] for c in status["conditions"]} == {"Ready", "DispatcherReady", "WorkersReady"}
        assert all(c["observedGeneration"] == obj["metadata"]["generation"] for c in status["conditions"])
        assert k8s.condition(name, "Ready")["status"] == "False"  # no node they tolerate: nothing is ready yet
        workers = k8s.get("statefulset", f"{name}-worker")
        assert workers is not None and workers["spec"]["podManagementPolicy"] == "Parallel"
        if doc["spec"]["shardingPolicy"] in ("FILE", "DATA", "FILE_OR_DATA", "HINT"):
            assert status["workerAddresses"] == [
                f"{name}-worker-{i}.{name}-worker.{k8s.ns}.svc.cluster.local:5051" for i in range(2)
            ]
        else:
            assert "workerAddresses" not in status


def test_the_multi_worker_example_applies_and_its_pods_get_the_names_tf_config_lists(k8s: Cluster) -> None:
    """`kubectl apply -f examples/multi-worker/` as its README says: every object accepted, the service's
    settings published, and the Job controller's pods named as entry.py's TF_CONFIG expects."""
    folder = ROOT / "examples" / "multi-worker"
    k8s.run("apply", "-f", str(folder))
    try:
        wait_reconciled(k8s, "multi-worker")
        wait_for(lambda: k8s.get("configmap", "multi-worker-client"), 30, "the published settings")

        def pods() -> list[dict[str, Any]]:
            listed = k8s.run("get", "pods", "-l", "batch.kubernetes.io/job-name=multi-worker-trainer", "-o", "json")
            return sorted(json.loads(listed.stdout)["items"], key=lambda p: p["spec"].get("hostname", ""))

        found = wait_for(lambda: pods() if len(pods()) == 2 else None, 30, "the Job's 2 pods", show=pods)
        (container,) = found[0]["spec"]["containers"]
        address = {e["name"]: e.get("value") for e in container["env"]}["TRAINER_ADDRESS"]
        for index, pod in enumerate(found):
            assert pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == str(index)
            name = f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}:2222"
            assert name == address.format(index=index), f"pod {index} is {name}, TF_CONFIG lists {address}"
        headless = k8s.get("service", "multi-worker-trainers")
        assert headless is not None and headless["spec"]["clusterIP"] == "None"
    finally:
        k8s.run("delete", "-f", str(folder), "--wait=false")


def test_kubectl_get_shows_the_printer_columns(k8s: Cluster) -> None:
    for name in example_names():
        wait_reconciled(k8s, name)
    table = k8s.run("get", "tfdata").stdout.splitlines()
    assert table[0].split() == ["NAME", "POLICY", "WORKERS", "HELD", "READY", "AGE"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["shards"][1:4] == ["FILE", "0/2", "False"]
    assert rows["augment"][1] == "OFF"
    wide = k8s.run("get", "tfdata", "shards", "-o", "wide").stdout
    assert "ADDRESS" in wide and f"grpc://shards-dispatcher.{k8s.ns}.svc.cluster.local:5050" in wide


def test_kubectl_explain_documents_the_fields(k8s: Cluster) -> None:
    spec = k8s.kubectl.run("explain", "tfdataservice.spec").stdout
    for field in ("shardingPolicy", "dispatcher", "workers", "autoscaling", "image"):
        assert field in spec
    assert 'Quote "OFF" in YAML' in spec
    storage = k8s.kubectl.run("explain", "tfdataservice.spec.dispatcher.storage.whenDeleted").stdout
    assert "Retain" in storage and "Delete" in storage


def test_kubectl_wait_works_on_the_conditions(k8s: Cluster) -> None:
    if k8s.has_nodes:
        pytest.skip("this cluster's kubelets report pod readiness (tests/kind waits for Ready with real pods)")
    # The workers tolerate the kwok node from the start and turn Ready there; the dispatcher stays Pending
    # until it is moved there too. (Moving Parallel workers later races the StatefulSet controller's own
    # replacement of unready pods with the operator's: a rolling update of its own, not what this checks.)
    spec = f'shardingPolicy: "OFF"\nworkers: {{replicas: 2, tolerations: [{json.dumps(devcluster.KWOK_TOLERATION)}]}}'
    k8s.apply_text(manifest(BadSpec("wait", spec, "", "", name="waited")))
    wait_reconciled(k8s, "waited")
    k8s.run("wait", "--for=condition=WorkersReady", "tfdata/waited", "--timeout=60s", timeout=70)
    k8s.run("wait", "--for=condition=DispatcherReady=False", "tfdata/waited", "--timeout=30s")
    assert k8s.condition("waited", "Ready")["status"] == "False"
    wait_for(lambda: k8s.get("pod", "waited-dispatcher-0"), 30, "the dispatcher pod")
    k8s.run_pods("waited", "dispatcher")
    k8s.run("wait", "--for=condition=DispatcherReady", "tfdata/waited", "--timeout=60s", timeout=70)
    k8s.run("wait", "--for=condition=Ready", "tfdata/waited", "--timeout=60s", timeout=70)
    assert k8s.service("waited")["status"]["workers"] == {
        "replicas": 2,
        "readyReplicas": 2,
        "summary": "2/2",
        "desired": 2,
        "current": 2,
    }


# --- Bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_the_api_server_refuses_bad_input_with_a_clear_message(k8s: Cluster, case: BadSpec) -> None:
    result = k8s.apply_text(manifest(case), check=False)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert case.api_says in result.stderr
    assert k8s.get("tfdataservice", case.name) is None


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (REQUESTS_ABOVE_LIMITS, "requests.memory (2Gi) exceeds"),
        # The operator runs without --allow-host-path-volumes.
        (HOST_PATH, "spec.workers.volumes[0] (home) is a hostPath volume, which this operator refuses"),
    ],
    ids=["requests-above-limits", "host-path"],
)
def test_an_invalid_spec_past_the_schema_changes_nothing_that_exists(k8s: Cluster, bad: str, says: str) -> None:
    good = "shardingPolicy: DYNAMIC\nworkers:\n  replicas: 2\n"
    k8s.apply_text(manifest(BadSpec("ok", good, "", "", name="guarded")))
    wait_reconciled(k8s, "guarded")
    wait_for(lambda: len(k8s.children("guarded")) == DEFAULT_CHILDREN, 30, "the children of guarded")
    before = k8s.resource_versions("guarded")
    del before["TFDataService"]

    k8s.apply_text(manifest(BadSpec("bad", bad, "", "", name="guarded")))
    ready = wait_for(
        lambda: (lambda c: c if c.get("reason") == "InvalidSpec" else None)(k8s.condition("guarded", "Ready")),
        30,
        "Ready=False/InvalidSpec",
    )
    assert ready["status"] == "False"
    assert says in ready["message"]
    events = k8s.run(
        "get", "events", "--field-selector", "involvedObject.name=guarded,type=Warning", "-o", "json"
    ).stdout
    assert any(e["reason"] == "InvalidSpec" and says in e["message"] for e in json.loads(events)["items"]), events
    after = k8s.resource_versions("guarded")
    del after["TFDataService"]
    assert after == before, "an invalid spec must not touch the existing children"

    k8s.apply_text(manifest(BadSpec("ok", good, "", "", name="guarded")))
    wait_for(lambda: k8s.condition("guarded", "Ready").get("reason") != "InvalidSpec", 30, "the spec fixed")


# --- Scaling ------------------------------------------------------------------------------------


def test_kubectl_scale_changes_dynamic_workers(k8s: Cluster) -> None:
    wait_reconciled(k8s, "imagenet")
    k8s.run("scale", "tfdata/imagenet", "--replicas=4")
    wait_for(
        lambda: k8s.replicas("imagenet-worker") == 4, 30, "4 workers", show=lambda: k8s.replicas("imagenet-worker")
    )
    scale = json.loads(
        k8s.run("get", "--raw", f"/apis/{API_VERSION}/namespaces/{k8s.ns}/tfdataservices/imagenet/scale").stdout
    )
    assert scale["spec"]["replicas"] == 4
    assert "app.kubernetes.io/instance=imagenet" in scale["status"]["selector"]
    assert k8s.worker_list("imagenet") is None


class StatefulSetWatch(Watch):
    """The service's StatefulSets: every version, in the API server's order."""

    def __init__(self, k8s: Cluster, instance: str) -> None:
        super().__init__(k8s.kubectl, "statefulsets", "-n", k8s.ns, "-l", f"app.kubernetes.io/instance={instance}")

    def wait_for_state(self, name: str, state: tuple[int, int]) -> None:
        """Until the watch has delivered the versions that end in ``state`` (it may lag a GET)."""
        wait_for(lambda: _states(self.events, name)[-1:] == [state], 10, f"the watch to show {state}",
                 show=lambda: _states(self.events, name))  # fmt: skip


def _states(events: list[dict[str, Any]], name: str) -> list[tuple[int, int]]:
    """(dispatcher list length, worker replicas) after every event, in order."""
    listed, workers, states = -1, -1, []
    for sts in events:
        if sts["metadata"]["name"] == f"{name}-dispatcher":
            env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
            listed = len(json.loads(env["TFDATA_SERVER_CONFIG"])["worker_addresses"])
        else:
            workers = sts["spec"]["replicas"]
        if listed >= 0 and workers >= 0 and (not states or states[-1] != (listed, workers)):
            states.append((listed, workers))
    return states


def assert_scaled_in_order(
    states: list[tuple[int, int]], start: tuple[int, int], middle: tuple[int, int], end: tuple[int, int]
) -> None:
    """States are (dispatcher list length, worker replicas) in watch order; ``middle`` shows who moved first."""
    assert states[0] == start and states[-1] == end, states
    assert all(workers <= listed for listed, workers in states), f"a worker ran outside the list: {states}"
    assert middle in states, f"expected the intermediate state {middle}: {states}"


def test_static_scale_up_changes_the_dispatcher_list_before_any_new_worker(k8s: Cluster) -> None:
    wait_reconciled(k8s, "shards")
    watch = StatefulSetWatch(k8s, "shards")
    try:
        wait_for(lambda: len(watch.events) >= 2, 20, "the watch to list the StatefulSets")
        old_uid = wait_for(lambda: k8s.get("pod", "shards-dispatcher-0"), 30, "the dispatcher pod")["metadata"]["uid"]
        k8s.run("scale", "tfdata/shards", "--replicas=3")
        wait_for(lambda: len(k8s.worker_list("shards") or []) == 3, 30, "the dispatcher's 3-worker list")
        # The operator replaces the not-ready dispatcher pod stuck on the old revision; the new one comes up.

        def new_dispatcher_pod() -> bool:
            pod, sts = k8s.get("pod", "shards-dispatcher-0"), k8s.get("statefulset", "shards-dispatcher")
            if not (pod and sts) or sts["status"].get("observedGeneration") != sts["metadata"]["generation"]:
                return False
            revision = pod["metadata"]["labels"]["controller-revision-hash"]
            return bool(revision == sts["status"].get("updateRevision") and pod["metadata"]["uid"] != old_uid)

        def new_dispatcher_ready() -> bool:
            pod = k8s.get("pod", "shards-dispatcher-0") or {}
            ready = any(
                c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])
            )
            return ready and new_dispatcher_pod()

        # The operator must now hold the workers back until the new dispatcher is ready: sampled
        # for longer than a resync, not read once. (Where kubelets run, that pod may get ready.)
        wait_for(lambda: k8s.condition("shards", "WorkersReady").get("reason"), 30, "WorkersReady=Scaling",
                 until=lambda reason: reason == "Scaling")  # fmt: skip
        holds_for(
            lambda: (k8s.replicas("shards-worker"), k8s.condition("shards", "WorkersReady").get("reason")),
            HOLD_SECONDS,
            "2 workers held back while Scaling",
            ok=lambda seen: seen == (2, "Scaling") or (k8s.has_nodes and new_dispatcher_ready()),
        )

        wait_for(new_dispatcher_pod, 30, "a dispatcher pod with the new configuration")
        # Once a dispatcher pod with the 3-worker list has started (on the kwok node; on kind, placed
        # first on the full node), the third worker follows.
        k8s.run_pods("shards", "dispatcher")
        wait_for(
            lambda: k8s.replicas("shards-worker") == 3,
            60,
            "the third worker",
            show=lambda: k8s.replicas("shards-worker"),
        )
        watch.wait_for_state("shards", (3, 3))
        pod = k8s.get("pod", "shards-dispatcher-0")
        assert pod is not None and "running" in pod["status"]["containerStatuses"][0]["state"], pod
    finally:
        watch.stop()
    assert_scaled_in_order(_states(watch.events, "shards"), start=(2, 2), middle=(3, 2), end=(3, 3))


def test_static_scale_down_waits_for_readers_then_removes_workers_before_shortening_the_list(k8s: Cluster) -> None:
    wait_for(lambda: k8s.replicas("shards-worker") == 3, 30, "3 workers")
    watch = StatefulSetWatch(k8s, "shards")
    try:
        wait_for(lambda: len(watch.events) >= 2, 20, "the watch to list the StatefulSets")
        k8s.run("scale", "tfdata/shards", "--replicas=1")
        # The dispatcher pod runs (kwok marks it so; on kind it runs for real) but this operator, a
        # process outside the cluster, cannot ask it (nothing listens for a kwok pod; a kind pod's IP is
        # not routed from the host): whether a client reads is unknown, which counts as reading, so
        # rescalePolicy WhenIdle holds the change.
        status = wait_for(lambda: k8s.service("shards").get("status") or {}, 30, "the change to be held",
                          until=lambda st: (st.get("held") or {}).get("change") == "workers 3→1")  # fmt: skip
        assert "unknown" in status["held"]["message"] and "rescalePolicy: Immediate" in status["held"]["message"]
        assert (status["workers"]["desired"], status["workers"]["current"]) == (1, 3), status["workers"]
        assert k8s.condition("shards", "WorkersReady")["reason"] == "RescaleHeld"
        shown = k8s.run("get", "tfdata", "shards").stdout
        assert "workers 3→1" in shown, shown
        holds_for(lambda: (k8s.replicas("shards-worker"), len(k8s.worker_list("shards") or [])), HOLD_SECONDS,
                  "3 workers and the 3-worker list while held", ok=lambda seen: seen == (3, 3))  # fmt: skip
        policy = {"spec": {"workers": {"rescalePolicy": "Immediate"}}}
        k8s.run("patch", "tfdata", "shards", "--type=merge", "-p", json.dumps(policy))
        wait_for(lambda: len(k8s.worker_list("shards") or []) == 1, 60, "the dispatcher's 1-worker list")
        watch.wait_for_state("shards", (1, 1))
    finally:
        watch.stop()
    assert_scaled_in_order(_states(watch.events, "shards"), start=(3, 3), middle=(3, 1), end=(1, 1))
    wait_for(lambda: (k8s.service("shards").get("status") or {}).get("held") is None, 30, "the hold to end")


def test_suspend_removes_every_pod_and_keeps_the_claim_services_and_address(k8s: Cluster) -> None:
    k8s.apply_text(manifest(BadSpec("parked", "shardingPolicy: FILE\nworkers: {replicas: 2}", "", "", name="parked")))
    selector = "app.kubernetes.io/instance=parked"

    def pods() -> list[str]:
        return sorted(
            p["metadata"]["name"]
            for p in json.loads(k8s.run("get", "pods", "-l", selector, "-o", "json").stdout)["items"]
        )

    wait_for(lambda: len(pods()) == 3, 30, "the dispatcher and 2 worker pods", show=pods)
    wait_for(lambda: k8s.get("pvc", "journal-parked-dispatcher-0"), 30, "the journal claim")
    address = wait_reconciled(k8s, "parked")["status"]["dispatcherAddress"]

    k8s.run("patch", "tfdata", "parked", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: not pods(), 60, "every pod of the suspended service to go", show=pods)
    suspended = wait_for(lambda: k8s.condition("parked", "Suspended"), 30, "Suspended=True",
                         until=lambda c: c.get("status") == "True")  # fmt: skip
    assert "no pod runs" in suspended["message"] or "stopping" in suspended["message"], suspended
    assert k8s.condition("parked", "Ready")["reason"] == "Suspended"
    assert k8s.service("parked")["status"]["dispatcherAddress"] == address
    assert k8s.get("pvc", "journal-parked-dispatcher-0") is not None, "the journal claim must stay"
    for service in ("parked-dispatcher", "parked-dispatcher-pods", "parked-worker"):
        assert k8s.get("service", service) is not None, f"Service {service} must stay"
    assert (k8s.replicas("parked-dispatcher"), k8s.replicas("parked-worker")) == (0, 0)

    k8s.run("patch", "tfdata", "parked", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: len(pods()) == 3, 30, "the pods back after the resume", show=pods)
    resumed = wait_for(lambda: k8s.condition("parked", "Suspended"), 30, "Suspended=False (Resumed)",
                       until=lambda c: c.get("reason") == "Resumed")  # fmt: skip
    assert resumed["status"] == "False"
    assert k8s.service("parked")["status"]["dispatcherAddress"] == address
    k8s.run("delete", "tfdata", "parked", "--wait=true", "--timeout=60s")


def test_autoscaling_creates_an_hpa_that_drives_the_scale_subresource(k8s: Cluster) -> None:
    spec = (
        "shardingPolicy: DYNAMIC\nworkers:\n  replicas: 1\n  resources: {requests: {cpu: 100m}}\n"
        "autoscaling: {metric: CPU, minReplicas: 3, maxReplicas: 5}\n"
    )
    k8s.apply_text(manifest(BadSpec("auto", spec, "", "", name="autoscaled")))
    hpa = wait_for(lambda: k8s.get("hpa", "autoscaled-worker"), 30, "the HPA")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "name": "autoscaled",
    }
    # The controller-manager's HPA controller raises the count to minReplicas through the scale subresource.
    wait_for(
        lambda: k8s.service("autoscaled")["spec"]["workers"]["replicas"] == 3,
        90,
        "the HPA to clamp spec.workers.replicas to minReplicas",
        show=lambda: (
            k8s.service("autoscaled")["spec"]["workers"],
            (k8s.get("hpa", "autoscaled-worker") or {}).get("status"),
        ),
    )
    wait_for(lambda: k8s.replicas("autoscaled-worker") == 3, 30, "3 worker replicas")

    without = "shardingPolicy: DYNAMIC\nworkers:\n  replicas: 3\n  resources: {requests: {cpu: 100m}}\n"
    k8s.apply_text(manifest(BadSpec("auto", without, "", "", name="autoscaled")))
    wait_for(lambda: k8s.get("hpa", "autoscaled-worker") is None, 30, "the HPA to be deleted")


# --- Drift, idleness, crashes, deletion ------------------------------------------------------------


def test_deleted_and_edited_children_are_repaired(k8s: Cluster) -> None:
    wait_reconciled(k8s, "records")
    original = k8s.get("service", "records-worker")
    assert original is not None
    k8s.run("delete", "service", "records-worker")
    wait_for(
        lambda: (lambda s: s and s["metadata"]["uid"] != original["metadata"]["uid"])(
            k8s.get("service", "records-worker")
        ),
        30,
        "the deleted headless Service to be recreated",
    )
    k8s.run("scale", "statefulset", "records-worker", "--replicas=5")
    wait_for(
        lambda: k8s.replicas("records-worker") == 2,
        30,
        "the worker count to be restored",
        show=lambda: k8s.replicas("records-worker"),
    )
    edit = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil:latest"}]
    k8s.run("patch", "statefulset", "records-dispatcher", "--type=json", "-p", json.dumps(edit))
    wait_for(
        lambda: (
            k8s.get("statefulset", "records-dispatcher")["spec"]["template"]["spec"]["containers"][0]["image"]
            != "evil:latest"
        ),
        30,
        "the dispatcher's image to be restored",
    )


def settled(probe: Any, seconds: float) -> Any:
    """``probe()``'s value if it stays the same over ``seconds`` (the controllers' writes are done), else None."""
    first = probe()
    time.sleep(seconds)
    return first if probe() == first else None


def requests(operator: OperatorProcess) -> float:
    return operator.total("tfdata_operator_api_requests_total")


def assert_reconciles_write_nothing(k8s: Cluster, operator: OperatorProcess, name: str) -> None:
    """Once the service's children have settled, an event on it and two resyncs are three reconciles
    of this very service, each of them a success that wrote nothing (result "idle"): no child
    changed, and not one request, let alone a write, reached the API server (idle reconciles work
    from the cache). Any other result of its reconciles meanwhile (a change, an error) fails."""
    before = wait_for(lambda: settled(lambda: k8s.resource_versions(name), 3), 60, "the children to settle")
    counted = operator.reconciles(k8s.ns, name)
    sent = requests(operator)

    def since() -> dict[str, float]:
        now = operator.reconciles(k8s.ns, name)
        return {result: n - counted.get(result, 0) for result, n in now.items() if n != counted.get(result, 0)}

    # An annotation change is an event on the TFDataService: it queues a reconcile (so does the 5 s resync).
    k8s.run("annotate", f"tfdata/{name}", "example.com/touched=yes")
    results = wait_for(
        since,
        30,
        f"three reconciles of {name} after the annotation (the event and two resyncs)",
        until=lambda seen: seen.get("idle", 0) >= 3 or bool(seen.keys() - {"idle"}),
        show=lambda: (since(), operator.tail()),
    )
    assert results.keys() == {"idle"}, f"reconciles of {name} by result since the annotation: {results}"
    after = k8s.resource_versions(name)
    assert {k: v for k, v in after.items() if k != "TFDataService"} == {
        k: v for k, v in before.items() if k != "TFDataService"
    }
    assert requests(operator) == sent, operator.metrics()


def test_a_reconcile_with_nothing_to_do_writes_nothing(k8s: Cluster, operator: OperatorProcess) -> None:
    wait_reconciled(k8s, "mixed")
    wait_for(lambda: len(k8s.children("mixed")) == DEFAULT_CHILDREN, 30, "the children of mixed")
    assert_reconciles_write_nothing(k8s, operator, "mixed")


# Volumes, mounts and variables with the false and empty fields the API server drops, and fields it defaults.
MOUNTED = """\
shardingPolicy: FILE
workers:
  replicas: 2
  volumes:
  - {name: tfrecords, persistentVolumeClaim: {claimName: tfrecords, readOnly: false}}
  - {name: creds, secret: {secretName: s3, optional: false}}
  - {name: settings, configMap: {name: settings}}
  volumeMounts:
  - {name: tfrecords, mountPath: /data, readOnly: false}
  - {name: creds, mountPath: /var/run/creds, readOnly: true, subPath: ""}
  env:
  - {name: EMPTY, value: ""}
  - {name: REGION, valueFrom: {configMapKeyRef: {name: settings, key: region}}}
  - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
  envFrom:
  - {secretRef: {name: s3}, prefix: S3_}
"""


def test_volumes_and_env_reach_the_worker_pods_and_an_unchanged_spec_writes_nothing(
    k8s: Cluster, operator: OperatorProcess
) -> None:
    text = manifest(BadSpec("mounted", MOUNTED, "", "", name="mounted"))
    k8s.apply_text(text)
    wait_reconciled(k8s, "mounted")
    wait_children(k8s, "mounted", expected_children(yaml.safe_load(text)))
    workers = k8s.get("statefulset", "mounted-worker")
    assert workers is not None
    template = workers["spec"]["template"]["spec"]
    assert [v["name"] for v in template["volumes"]] == ["tmp", "tfrecords", "creds", "settings"]
    (server,) = template["containers"]
    assert {m["name"]: m["mountPath"] for m in server["volumeMounts"]} == {
        "tmp": "/tmp",
        "tfrecords": "/data",
        "creds": "/var/run/creds",
    }
    assert [e["name"] for e in server["env"]][-3:] == ["EMPTY", "REGION", "NODE"]
    assert server["envFrom"] == [{"secretRef": {"name": "s3"}, "prefix": "S3_"}]
    dispatcher = k8s.get("statefulset", "mounted-dispatcher")
    assert dispatcher is not None and "envFrom" not in dispatcher["spec"]["template"]["spec"]["containers"][0]

    # The pods the StatefulSet controller made carry them too.
    selector = "app.kubernetes.io/instance=mounted,app.kubernetes.io/component=worker"
    pods = wait_for(
        lambda: k8s.kubectl.json("get", "pods", "-n", k8s.ns, "-l", selector)["items"] or None,
        30,
        "the worker pods of mounted",
    )
    assert all({"tfrecords", "creds", "settings"} <= {v["name"] for v in p["spec"]["volumes"]} for p in pods)

    # What the API server stores (readOnly: false and value "" dropped, defaultMode and apiVersion
    # added) still matches the template the operator builds: an unchanged spec means no request.
    assert_reconciles_write_nothing(k8s, operator, "mounted")
    k8s.run("delete", "tfdata", "mounted", "--wait=false")


def test_killing_the_operator_between_two_applies_converges_without_duplicates_or_orphans(
    k8s: Cluster, operator: OperatorProcess
) -> None:
    operator.stop()
    operator.start(TFDATA_TEST_FAULT="after-first-apply")
    k8s.apply_text(manifest(BadSpec("crash", "shardingPolicy: HINT\nworkers: {replicas: 3}", "", "", name="crashy")))
    # The fault point: the operator dies right after its first apply of this reconcile.
    assert operator.wait_exit(60) == faults.EXIT_CODE, operator.tail()
    assert "Fault point after-first-apply reached" in operator.log()
    partial = k8s.children("crashy")
    assert [(c["kind"], c["metadata"]["name"]) for c in partial] == [("Service", "crashy-dispatcher")], partial
    assert not (k8s.service("crashy").get("status") or {}).get("conditions"), "the killed operator wrote no status"
    first_uid = partial[0]["metadata"]["uid"]
    operator.start()
    obj = wait_reconciled(k8s, "crashy")
    children = wait_for(
        lambda: (lambda c: c if len(c) == DEFAULT_CHILDREN else None)(k8s.children("crashy")),
        30,
        f"{DEFAULT_CHILDREN} children",
        show=lambda: [(c["kind"], c["metadata"]["name"]) for c in k8s.children("crashy")],
    )
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert len(set(names)) == len(names) == DEFAULT_CHILDREN, names
    for child in children:
        assert [r["uid"] for r in child["metadata"]["ownerReferences"]] == [obj["metadata"]["uid"]]
    # The child the killed operator created was adopted as it was, not created a second time.
    assert (
        next(c for c in children if c["metadata"]["name"] == "crashy-dispatcher" and c["kind"] == "Service")[
            "metadata"
        ]["uid"]
        == first_uid
    )
    assert len(k8s.worker_list("crashy") or []) == 3


def _claim(k8s: Cluster, name: str) -> dict[str, Any] | None:
    return k8s.get("pvc", f"journal-{name}-dispatcher-0")


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_deletion_collects_every_child_and_keeps_the_journal_as_told(k8s: Cluster, policy: str) -> None:
    name = f"gone-{policy.lower()}"
    spec = f"shardingPolicy: DYNAMIC\ndispatcher:\n  storage: {{whenDeleted: {policy}}}\n"
    k8s.apply_text(manifest(BadSpec("gc", spec, "", "", name=name)))
    wait_for(lambda: len(k8s.children(name)) == DEFAULT_CHILDREN, 30, f"the children of {name}")
    wait_for(lambda: _claim(k8s, name), 30, "the journal claim")
    k8s.run("delete", "tfdata", name, "--wait=true", "--timeout=30s", timeout=40)
    wait_for(lambda: k8s.children(name) == [], 60, "the garbage collector", show=lambda: k8s.children(name))
    if policy == "Retain":
        # The garbage collector already took every child; the claim must stay through a resync.
        holds_for(lambda: _claim(k8s, name) is not None, HOLD_SECONDS, "the retained journal claim")
        k8s.run("delete", "pvc", f"journal-{name}-dispatcher-0")
    else:
        # With nodes, the claim goes once the dispatcher pod using it has terminated (pvc-protection).
        timeout = 180 if k8s.has_nodes else 60
        wait_for(
            lambda: _claim(k8s, name) is None,
            timeout,
            "the journal claim to be deleted",
            show=lambda: _claim(k8s, name),
        )


def test_a_foreign_object_with_a_childs_name_is_never_touched(k8s: Cluster) -> None:
    foreign = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "taken-worker", "namespace": k8s.ns, "labels": {"owner": "someone-else"}},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "other"}},
    }
    created = k8s.kubectl.apply(foreign)
    k8s.apply_text(manifest(BadSpec("taken", "shardingPolicy: DYNAMIC", "", "", name="taken")))
    ready = wait_for(
        lambda: (lambda c: c if c.get("reason") == "NameConflict" else None)(k8s.condition("taken", "Ready")),
        30,
        "Ready=False/NameConflict",
    )
    assert "Service taken-worker" in ready["message"]
    after = k8s.get("service", "taken-worker")
    assert after is not None and after["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert k8s.children("taken") == [], "nothing may be created while a name is taken"
    k8s.run("delete", "service", "taken-worker")
    wait_for(lambda: len(k8s.children("taken")) == DEFAULT_CHILDREN, 60, "the children once the name is free")


def test_the_operator_logged_no_errors(operator: OperatorProcess) -> None:
    log = operator.log()
    assert "Forbidden" not in log and "Traceback" not in log, operator.tail(80)
    assert not operator.errors(), "\n".join(operator.errors())
    assert "Created StatefulSet" in log
