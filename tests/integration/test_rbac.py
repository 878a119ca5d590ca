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

from tfdata_operator.plan import children

from fixtures.cases import EXAMPLES, expected_children
from fixtures.manifests import API_VERSION
from fixtures.support import ROOT, Kubectl, OperatorProcess, log_message, to_run, wait_for

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
    ("update", "tfdataservices.tfdata.dev"),
    # spec.lifecycle reads the workload a service follows by name, and never changes it.
    ("list", "jobs.batch"),
    ("watch", "jobs.batch"),
    ("delete", "jobs.batch"),
    ("patch", "jobs.batch"),
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

    # spec.lifecycle: the Job a service follows is read by name (get), and the service tied to it (a
    # patch of its own ownerReferences). A suspended Job: no pod, nothing else to schedule.
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns.name},
           "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                           "containers": [{"name": "t", "image": "t"}]}}}}  # fmt: skip
    ns.kubectl.run("apply", "-n", ns.name, "-f", "-", input=json.dumps(job))
    job_uid = ns.get("job", "train")["metadata"]["uid"]
    life = {"workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "train"}, "deleteWithWorkload": True}
    ns.run("patch", "tfdata/augment", "--type=merge", "-p", json.dumps({"spec": {"lifecycle": life}}))

    def tied() -> bool:
        svc = ns.get("tfdataservice", "augment")
        state = ((svc.get("status") or {}).get("lifecycle") or {}).get("workload", {}).get("state")
        return state == "Running" and job_uid in {r["uid"] for r in svc["metadata"].get("ownerReferences") or []}

    wait_for(tied, 30, "augment tied to its Job (read by name, its ownerReferences patched)")

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
    # kubectl cannot ask about a kind the cluster does not serve (a JobSet without its CRD): the
    # rules review above proved the role holds those.
    served = {v.rpartition("/")[0] for v in admin.run("api-versions").stdout.split()}
    questions = [(rule[2], qualified(rule), namespace, True) for rule in sorted(expected) if rule[0] in served]
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


# --- What the chart grants the namespace's users --------------------------------------------------------


@contextmanager
def aggregated_roles(kubectl: Kubectl, kube_env: dict[str, str], namespace: str) -> Iterator[None]:
    """The chart's ClusterRoles that aggregate into view, edit and admin, applied as admin; removed afterwards."""
    manifests = helm_template(kube_env, namespace, [], "aggregate-roles.yaml")
    kubectl.run("apply", "-f", "-", input=manifests)
    try:
        yield
    finally:
        kubectl.run("delete", "-f", "-", "--ignore-not-found", input=manifests)


def can(kubectl: Kubectl, user: str, verb: str, resource: str, namespace: str) -> bool:
    resource, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, f"{resource}.tfdata.dev", f"--as={user}", "-n", namespace]
    answer = kubectl.run(*args, *([f"--subresource={subresource}"] if subresource else []), check=False).stdout
    assert answer.strip() in ("yes", "no"), answer
    return answer.strip() == "yes"


DYNAMIC = ROOT / "examples" / "dynamic.yaml"  # TFDataService imagenet
SNAPSHOT = f"""
apiVersion: {API_VERSION}
kind: TFDataSnapshot
metadata: {{name: epoch-1}}
spec: {{service: imagenet}}
"""


def test_edit_may_create_the_operators_kinds_and_view_only_read_them(
    crd: None, kubectl: Kubectl, kube_env: dict[str, str], namespace: str, namespaces: list[str]
) -> None:
    """Users bound to Kubernetes' own edit and view roles in a namespace, with the chart's aggregated
    ClusterRoles installed: edit creates, scales and deletes TFDataServices and TFDataSnapshots (it may
    create the pods they run already); view reads them and is refused every write; neither gets
    anything in a namespace where it is not bound."""
    team, other = namespaces[0], namespaces[1]
    editor, viewer = f"editor-{RELEASE}", f"viewer-{RELEASE}"
    for user, role in ((editor, "edit"), (viewer, "view")):
        kubectl.run("create", "rolebinding", f"{user}", f"--clusterrole={role}", f"--user={user}", "-n", team)
    with aggregated_roles(kubectl, kube_env, namespace):
        # The clusterrole-aggregation controller (kube-controller-manager) copies the rules into the roles.
        wait_for(lambda: can(kubectl, editor, "create", "tfdataservices", team), 30, "edit to get tfdataservices",
                 show=lambda: kubectl.json("get", "clusterrole", "edit")["rules"][-3:])  # fmt: skip
        wait_for(lambda: can(kubectl, viewer, "list", "tfdatasnapshots", team), 30, "view to get tfdatasnapshots")

        as_editor = ["--as", editor, "-n", team]
        kubectl.run("apply", "--server-side", *as_editor, "-f", str(DYNAMIC))
        name = yaml.safe_load(DYNAMIC.read_text())["metadata"]["name"]
        kubectl.run("scale", f"tfdata/{name}", "--replicas=3", *as_editor)
        assert kubectl.json("get", "tfdata", name, "-n", team)["spec"]["workers"]["replicas"] == 3
        kubectl.run("apply", "--server-side", *as_editor, "-f", "-", input=SNAPSHOT)

        as_viewer = ["--as", viewer, "-n", team]
        assert kubectl.json("get", "tfdata", name, *as_viewer)["metadata"]["name"] == name
        assert kubectl.json("get", "tfdatasnapshots", "epoch-1", *as_viewer)["spec"]["service"] == "imagenet"
        refused = [
            kubectl.run("scale", f"tfdata/{name}", "--replicas=1", *as_viewer, check=False),
            kubectl.run("delete", "tfdatasnapshots", "epoch-1", *as_viewer, check=False),
            kubectl.run("delete", "tfdata", name, *as_viewer, check=False),
            kubectl.run("create", *as_viewer, "-f", "-", check=False, input=SNAPSHOT.replace("epoch-1", "epoch-2")),
        ]
        assert all(r.returncode != 0 and "forbidden" in r.stderr for r in refused), [r.stderr for r in refused]
        for verb in ("create", "update", "patch", "delete"):
            assert not can(kubectl, viewer, verb, "tfdataservices", team), f"view may {verb} tfdataservices"
            assert not can(kubectl, viewer, verb, "tfdatasnapshots", team), f"view may {verb} tfdatasnapshots"
        assert not can(kubectl, viewer, "patch", "tfdataservices/scale", team)
        # Status stays the operator's to write.
        assert not can(kubectl, editor, "patch", "tfdataservices/status", team)
        for user in (editor, viewer):
            assert not can(kubectl, user, "get", "tfdataservices", other), f"{user} reads another namespace"

        kubectl.run("delete", "tfdatasnapshots", "epoch-1", *as_editor)
        kubectl.run("delete", "tfdata", name, *as_editor)

    # Without the chart's roles, edit no longer reaches the kinds.
    wait_for(lambda: not can(kubectl, editor, "create", "tfdataservices", team), 30, "edit to lose tfdataservices")


def admission_policy_example() -> str:
    """The ValidatingAdmissionPolicy and its binding that docs/operations.md shows, as written there."""
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    (policy,) = [b for b in blocks if "kind: ValidatingAdmissionPolicy\n" in b]
    return policy


def restricted(image: str = "registry.example.com/ml/tf:2.21", **workers: Any) -> str:
    body = {
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "metadata": {"name": "restricted"},
        "spec": {"image": image, "workers": workers},
    }
    return json.dumps(body)


def test_the_documented_admission_policy_restricts_images_accounts_and_code_loading_env(
    crd: None, kubectl: Kubectl, namespaces: list[str]
) -> None:
    """docs/operations.md's example ValidatingAdmissionPolicy, applied as written, refuses in a labelled
    namespace what it says it refuses, with its message, and lets the rest through; other namespaces
    are not affected."""
    team, other = namespaces[0], namespaces[1]
    kubectl.run("label", "namespace", team, "tfdata.dev/restricted=true")
    example = admission_policy_example()
    kubectl.run("apply", "-f", "-", input=example)
    try:

        def create(namespace: str, body: str) -> subprocess.CompletedProcess[str]:
            return kubectl.run("create", "--dry-run=server", "-n", namespace, "-f", "-", input=body, check=False)

        bad = [
            (restricted("docker.io/anyone/tf:latest"), "spec.image must be an image of registry.example.com/ml/"),
            (restricted(serviceAccountName="admin"), "serviceAccountName may only be tfdata-reader"),
            (restricted(env=[{"name": "PYTHONPATH", "value": "/data"}]), "env must not set PYTHON* or LD_*"),
            (restricted(env=[{"name": "LD_PRELOAD", "value": "/data/x.so"}]), "env must not set PYTHON* or LD_*"),
            (restricted(envFrom=[{"configMapRef": {"name": "settings"}}]), "envFrom is not allowed"),
        ]
        # A binding takes effect a moment after it is created: wait for the first refusal.
        wait_for(lambda: create(team, bad[0][0]).returncode != 0, 30, "the policy to refuse a foreign image",
                 show=lambda: create(team, bad[0][0]).stdout)  # fmt: skip
        for body, message in bad:
            result = create(team, body)
            assert result.returncode != 0 and message in result.stderr, (body, result.stderr)
            assert "ValidatingAdmissionPolicy 'tfdataservices-restricted'" in result.stderr, result.stderr
            assert create(other, body).returncode == 0, f"refused outside the labelled namespace: {body}"
        allowed = [
            restricted(serviceAccountName="tfdata-reader", env=[{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "1"}]),
            json.dumps({**json.loads(restricted()), "spec": {}}),  # the operator's server image, no account
        ]
        for body in allowed:
            result = create(team, body)
            assert result.returncode == 0, (body, result.stderr)
        # The API server type-checks the expressions against the CRD's schema: no warning.
        policy = wait_for(
            lambda: (lambda p: p if (p.get("status") or {}).get("observedGeneration") else None)(
                kubectl.json("get", "validatingadmissionpolicy", "tfdataservices-restricted")
            ),
            30,
            "the policy to be type-checked",
        )
        assert not policy["status"].get("typeChecking", {}).get("expressionWarnings"), policy["status"]
    finally:
        kubectl.run("delete", "-f", "-", "--ignore-not-found", input=example)
