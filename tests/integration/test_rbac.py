"""The chart's RBAC, proven both ways: the operator does its whole job with nothing but the
chart's ServiceAccount and roles, and that identity is refused everything else.

For each mode (every namespace: a ClusterRole; watchNamespaces: a Role per namespace), with two
replicas (so the operator elects a leader on a Lease in its own namespace), the
chart's ServiceAccount and RBAC templates are applied as admin (`helm template --show-only`:
the Deployment is left out, so no second operator can start on a cluster that has nodes), a
token is minted for the ServiceAccount, and the operator runs as a real process with a
kubeconfig holding nothing but that token, configured by the env of the chart's Deployment.

The all-namespaces operator reconciles every TFDataService in the cluster, as it would when
installed: against an existing cluster ($TFDATA_TEST_KUBECONFIG), run this where no other
operator manages TFDataServices.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, Kubectl, OperatorProcess, log_message, to_run, wait_for

from tfdata_operator.plan import children

from cases import EXAMPLES, expected_children

CHART = ROOT / "charts" / "tfdata-operator"
# Its ClusterRoles are cluster-wide: a name of its own, for sessions sharing a cluster.
RELEASE = f"rbac-{secrets.token_hex(2)}"
SA = f"{RELEASE}-tfdata-operator"
CHILD_KINDS = ",".join(kind.plural for kind in children.CHILDREN)

Rule = tuple[str, str, str]  # API group, resource (or resource/subresource), verb


def rules(group: str, resource: str, *verbs: str) -> set[Rule]:
    return {(group, resource, verb) for verb in verbs}


# Everything the operator may do in a namespace it watches: what its table of kinds needs.
# Why each is needed, and what broke without it, is in the comments of templates/_helpers.tpl.
NAMESPACED = children.namespaced_rules()
# kopf's runtime observation, at cluster scope: CRDs always; namespaces with a namespace list.
CRDS = rules("apiextensions.k8s.io", "customresourcedefinitions", "list", "watch")
NAMESPACES = rules("", "namespaces", "list", "watch")
# spec.nodeLoss reads a lost pod's Node and its journal's volume, wherever the operator watches.
CLUSTER = children.cluster_rules()
# Leader election, in the operator's own namespace only.
LEASE = children.leader_election_rules()
# Every authenticated identity may ask what it may do (system:basic-user).
SELF_REVIEWS = (
    rules("authorization.k8s.io", "selfsubjectaccessreviews", "create")
    | rules("authorization.k8s.io", "selfsubjectrulesreviews", "create")
    | rules("authentication.k8s.io", "selfsubjectreviews", "create")
)
# (verb, resource) the operator must never be able to do, in any namespace...
NEVER = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("create", "pods"),
    ("update", "pods"),
    ("create", "pods/exec"),
    ("create", "persistentvolumeclaims"),
    ("list", "persistentvolumeclaims"),
    ("update", "configmaps"),
    ("get", "configmaps"),
    ("update", "statefulsets.apps"),
    ("delete", "services"),
    ("create", "tfdataservices.tfdata.dev"),
    ("delete", "tfdataservices.tfdata.dev"),
    ("update", "tfdataservices.tfdata.dev"),
    ("update", "tfdataservices.tfdata.dev/scale"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("delete", "leases.coordination.k8s.io"),
]
# ... and at cluster scope.
NEVER_CLUSTER = [
    ("delete", "namespaces"),
    ("create", "namespaces"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("list", "nodes"),
    ("watch", "nodes"),
    ("update", "nodes"),
    ("patch", "nodes"),
    ("list", "persistentvolumes"),
    ("delete", "persistentvolumes"),
    ("get", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
]


@dataclass(frozen=True)
class Identity:
    """The chart's ServiceAccount: a kubeconfig with only its token, and the operator's env from the chart."""

    namespace: str
    kubeconfig: Path
    operator_env: dict[str, str]

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{SA}"

    def kubectl(self, admin: Kubectl) -> Kubectl:
        return Kubectl(admin.binary, {**admin.env, "KUBECONFIG": str(self.kubeconfig)})


def helm_template(kube_env: dict[str, str], namespace: str, watch: list[str], *templates: str) -> str:
    command = ["helm", "template", RELEASE, str(CHART), "-n", namespace]
    command += ["--set-json", f"watchNamespaces={json.dumps(watch)}", "--set", "replicaCount=2"]
    command += [arg for template in templates for arg in ("--show-only", f"templates/{template}")]
    result = subprocess.run(command, env=kube_env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


@contextmanager
def chart_identity(
    kubectl: Kubectl, kube_env: dict[str, str], namespace: str, watch: list[str], tmp_path: Path
) -> Iterator[Identity]:
    """The chart's ServiceAccount and RBAC applied as admin; removed again afterwards."""
    manifests = helm_template(kube_env, namespace, watch, "serviceaccount.yaml", "rbac.yaml", "leaderelection.yaml")
    kubectl.run("apply", "-f", "-", input=manifests)
    try:
        token = kubectl.run("create", "token", SA, "-n", namespace, "--duration=1h").stdout.strip()
        config = kubectl.json("config", "view", "--minify", "--raw")  # server and CA of the admin's
        config["users"] = [{"name": SA, "user": {"token": token}}]
        config["contexts"][0]["context"]["user"] = SA
        kubeconfig = tmp_path / "operator.kubeconfig"
        kubeconfig.write_text(json.dumps(config))
        deployment = yaml.safe_load(helm_template(kube_env, namespace, watch, "deployment.yaml"))
        env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        yield Identity(namespace, kubeconfig, env)
    finally:
        kubectl.run("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=manifests)


@contextmanager
def operator_as(identity: Identity, kube_env: dict[str, str], log: Path) -> Iterator[OperatorProcess]:
    """The operator with the chart's identity and env (the --log-format and --liveness flags
    that OperatorProcess adds change only how it reports); its log must show no refusal."""
    env = {**kube_env, **identity.operator_env, "KUBECONFIG": str(identity.kubeconfig)}
    process = OperatorProcess(env, log).start()
    try:
        yield process
    except BaseException:
        process.stop()
        raise
    text = process.finish()  # still running, exits 0 on SIGTERM, no traceback
    # The message only: the time kopf's log format puts first may end in ",403".
    refusals = [
        line
        for line in text.splitlines()
        if re.search(r"forbidden|(?<![\w-])403(?![\w-])|Not enough perm", log_message(line), re.I)
    ]
    assert not refusals, "the API server refused the operator:\n" + "\n".join(refusals[:10])


@pytest.fixture
def namespaces(kubectl: Kubectl, namespace: str) -> Iterator[list[str]]:
    """Three fresh namespaces for TFDataServices (the operator's own is `namespace`)."""
    names = [f"{namespace}-{secrets.token_hex(2)}" for _ in range(3)]
    for name in names:
        kubectl.run("create", "namespace", name)
    for name in names:  # pods are refused until the namespace's default ServiceAccount exists
        wait_for(lambda n=name: kubectl.run("get", "sa", "default", "-n", n, check=False).returncode == 0, 30, "sa")
    yield names
    kubectl.run("delete", "namespace", *names, "--wait=false", "--ignore-not-found")


# --- What the operator needs: it does its whole job -----------------------------------------------


class Namespace:
    def __init__(self, kubectl: Kubectl, name: str) -> None:
        self.kubectl, self.name = kubectl, name

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl.run(*args, "-n", self.name)

    def get(self, kind: str, name: str) -> Any:
        return self.kubectl.json("get", kind, name, "-n", self.name)

    def children(self, instance: str) -> set[tuple[str, str]]:
        items = self.kubectl.json("get", CHILD_KINDS, "-n", self.name, "-l", f"app.kubernetes.io/instance={instance}")
        return {(o["kind"], o["metadata"]["name"]) for o in items["items"]}

    def wait_reconciled(self, name: str) -> dict[str, Any]:
        def reconciled() -> dict[str, Any] | None:
            obj: dict[str, Any] = self.get("tfdataservice", name)
            return obj if (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"] else None

        return wait_for(reconciled, 60, f"{self.name}/{name} to be reconciled", show=lambda: self.get("tfdata", name))

    def wait_children(self, instance: str, expected: set[tuple[str, str]]) -> None:
        wait_for(
            lambda: self.children(instance) == expected,
            30,
            f"the children of {instance} to be {sorted(expected)}",
            show=lambda: sorted(self.children(instance)),
        )

    def wait_replicas(self, statefulset: str, replicas: int, timeout: float = 30) -> None:
        wait_for(
            lambda: self.get("statefulset", statefulset)["spec"]["replicas"] == replicas,
            timeout,
            f"{statefulset} to have {replicas} replicas",
            show=lambda: self.get("statefulset", statefulset)["spec"]["replicas"],
        )


def first_example(ns: Namespace) -> str:
    ns.run("apply", "-f", str(EXAMPLES[0]))
    name: str = yaml.safe_load(EXAMPLES[0].read_text())["metadata"]["name"]
    return name


def exercise_the_operator(ns: Namespace, run_first: str | None) -> None:
    """Every kind of call the operator makes, each checked by the change a user would see.
    ``run_first``: the PriorityClass that gets the dispatcher below placed on a full kind node."""
    for path in EXAMPLES:
        ns.run("apply", "-f", str(path))
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        name = doc["metadata"]["name"]
        status = ns.wait_reconciled(name)["status"]
        assert status["dispatcherAddress"] == f"grpc://{name}-dispatcher.{ns.name}.svc.cluster.local:5050"
        assert {c["type"] for c in status["conditions"]} == {"Ready", "DispatcherReady", "WorkersReady"}
        expected = expected_children(doc)
        ns.wait_children(name, expected)

    ns.run("scale", "tfdata/imagenet", "--replicas=3")
    ns.wait_replicas("imagenet-worker", 3)

    # A static policy restarts the dispatcher first: the operator deletes its pod, stuck Pending
    # on the old revision; once the new one is ready, the workers follow.
    old_pod = wait_for(lambda: ns.get("pod", "shards-dispatcher-0")["metadata"]["uid"], 30, "the dispatcher pod")
    ns.run("scale", "tfdata/shards", "--replicas=3")

    def dispatcher_replaced() -> bool:
        sts = ns.get("statefulset", "shards-dispatcher")
        if sts["status"].get("observedGeneration") != sts["metadata"]["generation"]:
            return False  # updateRevision may still name the old template
        pod = ns.get("pod", "shards-dispatcher-0")["metadata"]
        return bool(
            pod["uid"] != old_pod and pod["labels"]["controller-revision-hash"] == sts["status"]["updateRevision"]
        )

    wait_for(dispatcher_replaced, 30, "the operator to replace the dispatcher pod")
    # On the kwok node the new dispatcher pod starts (kwok reports it as a kubelet would; on kind it is placed
    # first, before the pods of the other examples, which do not all fit); then the workers follow.
    ns.run("patch", "tfdata/shards", "--type=merge", "-p", to_run("dispatcher", priority_class=run_first))
    ns.wait_replicas("shards-worker", 3, timeout=60)  # on kind it starts TensorFlow first, on a busy node

    # Optional children are deleted when the spec stops asking for them.
    ns.run("patch", "tfdata/elastic-cpu", "--type=json", "-p", '[{"op": "remove", "path": "/spec/autoscaling"}]')
    ns.run("patch", "tfdata/augment", "--type=merge", "-p", '{"spec": {"networkPolicy": {"enabled": false}}}')
    wait_for(lambda: ("HorizontalPodAutoscaler", "elastic-cpu-worker") not in ns.children("elastic-cpu"), 30, "no HPA")
    wait_for(lambda: ("NetworkPolicy", "augment") not in ns.children("augment"), 30, "no NetworkPolicy")

    ns.run("delete", "tfdata/records", "--timeout=30s")
    wait_for(lambda: not ns.children("records"), 30, "the children of records to be collected")

    events = ns.kubectl.json("get", "events", "-n", ns.name, "--field-selector=involvedObject.kind=TFDataService")
    assert any(e.get("reportingComponent") == "tfdata-operator" for e in events["items"]), "no event recorded"


# --- What it is refused -----------------------------------------------------------------------------


def held_rules(identity: Identity, admin: Kubectl, namespace: str) -> set[Rule]:
    """Every (group, resource, verb) the identity holds in ``namespace``, as the API server
    computes it for the identity's own token (a SelfSubjectRulesReview)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    answer = identity.kubectl(admin).run("create", "-f", "-", "-o", "json", input=json.dumps(review)).stdout
    held = set()
    for rule in json.loads(answer)["status"]["resourceRules"]:
        assert not rule.get("resourceNames"), rule
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"a wildcard: {rule}"
                    held.add((group, resource, verb))
    return held


def can_i(identity: Identity, admin: Kubectl, verb: str, resource: str, namespace: str | None = None) -> bool:
    """`kubectl auth can-i` as the ServiceAccount (impersonated by the admin)."""
    resource, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, resource, f"--as={identity.user}"]
    args += [f"--subresource={subresource}"] if subresource else []
    args += ["-n", namespace] if namespace else []
    answer = admin.run(*args, check=False).stdout.strip()
    assert answer in ("yes", "no"), answer
    return answer == "yes"


def qualified(rule: Rule) -> str:
    """``resource.group[/subresource]``, as kubectl names it."""
    group, resource, _ = rule
    name, _, subresource = resource.partition("/")
    return f"{name}.{group}".rstrip(".") + (f"/{subresource}" if subresource else "")


def assert_permissions(
    identity: Identity, admin: Kubectl, namespace: str, expected: set[Rule], elsewhere: Sequence[str] = ()
) -> None:
    """In ``namespace`` (and each of ``elsewhere``) the identity holds exactly ``expected``; `kubectl
    auth can-i` says yes to each of those in ``namespace``, and no to NEVER there and to NEVER_CLUSTER."""
    for ns in (namespace, *elsewhere):
        held = held_rules(identity, admin, ns) - SELF_REVIEWS
        assert held == expected, f"in {ns}, missing: {sorted(expected - held)}; beyond need: {sorted(held - expected)}"
    questions = [(rule[2], qualified(rule), namespace, True) for rule in sorted(expected)]
    questions += [(verb, resource, namespace, False) for verb, resource in NEVER]
    questions += [(verb, resource, None, False) for verb, resource in NEVER_CLUSTER]
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda q: can_i(identity, admin, *q[:3]), questions))
    wrong = [
        f"{verb} {resource} in {ns or 'the cluster'}"
        for (verb, resource, ns, want), got in zip(questions, answers, strict=True)
        if got != want
    ]
    assert not wrong, "kubectl auth can-i answered wrongly for: " + ", ".join(wrong)


# --- The two modes --------------------------------------------------------------------------------------


def test_every_namespace_with_a_cluster_role(
    crd: None,
    kubectl: Kubectl,
    kube_env: dict[str, str],
    namespace: str,
    namespaces: list[str],
    run_first: str | None,
    tmp_path: Path,
) -> None:
    with chart_identity(kubectl, kube_env, namespace, [], tmp_path) as identity:
        assert identity.operator_env["TFDATA_NAMESPACES"] == ""
        assert identity.operator_env["TFDATA_LEADER_ELECTION"] == "true"
        with operator_as(identity, kube_env, tmp_path / "operator.log") as operator:
            exercise_the_operator(Namespace(kubectl, namespaces[0]), run_first)
            other = Namespace(kubectl, namespaces[1])
            other.wait_reconciled(first_example(other))
        assert "Leading: took the Lease" in operator.log(), "the operator reconciled without electing itself"

        # The same rules in every namespace; kopf's CRD watch besides; nothing else.
        assert_permissions(
            identity, kubectl, namespaces[0], NAMESPACED | CRDS | CLUSTER, [namespaces[2], "kube-system"]
        )
        # The Lease only in its own namespace.
        assert_permissions(identity, kubectl, namespace, NAMESPACED | CRDS | CLUSTER | LEASE)


def test_listed_namespaces_with_a_role_each(
    crd: None,
    kubectl: Kubectl,
    kube_env: dict[str, str],
    namespace: str,
    namespaces: list[str],
    run_first: str | None,
    tmp_path: Path,
) -> None:
    watched, elsewhere = namespaces[:2], Namespace(kubectl, namespaces[2])
    with chart_identity(kubectl, kube_env, namespace, watched, tmp_path) as identity:
        assert identity.operator_env["TFDATA_NAMESPACES"] == " ".join(watched)
        with operator_as(identity, kube_env, tmp_path / "operator.log"):
            unwatched = first_example(elsewhere)
            exercise_the_operator(Namespace(kubectl, watched[0]), run_first)
            second = Namespace(kubectl, watched[1])
            second.wait_reconciled(first_example(second))
            # Never touched, and never even tried: the log shows no refusal.
            assert "status" not in elsewhere.get("tfdataservice", unwatched)
            assert not elsewhere.children(unwatched)

        assert_permissions(identity, kubectl, watched[0], NAMESPACED | CRDS | NAMESPACES | CLUSTER, watched[1:])
        assert_permissions(identity, kubectl, namespace, CRDS | NAMESPACES | CLUSTER | LEASE)
        # Elsewhere only the cluster-scoped reads (kopf's, spec.nodeLoss's): not even a read of a TFDataService.
        assert_permissions(identity, kubectl, elsewhere.name, CRDS | NAMESPACES | CLUSTER)
        assert not can_i(identity, kubectl, "list", "tfdataservices.tfdata.dev")
        refused = identity.kubectl(kubectl).run("get", "tfdataservices", "-n", elsewhere.name, check=False)
        assert refused.returncode != 0 and "forbidden" in refused.stderr, refused
