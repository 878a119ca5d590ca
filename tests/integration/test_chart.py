"""The Helm chart with the real helm and a real API server: lint, what it renders, what its
schema refuses, and install, upgrade and uninstall leaving nothing behind.

No node of the test cluster takes the operator's pod (kwok's is tainted), so it stays Pending:
the tests check the objects the chart creates, not a running operator (test_rbac.py runs the
operator with the chart's identity).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import CRD_DIR, ROOT, Kubectl, wait_for

CHART = ROOT / "charts" / "tfdata-operator"
CRD_NAME = "tfdataservices.tfdata.dev"
INSTANCE = "app.kubernetes.io/instance"

# A minimal stand-in for the Prometheus Operator's ServiceMonitor CRD, which the test cluster
# lacks: it lets the API server accept the kind in the dry-run, but checks none of its fields
# (test_service_monitor_scrapes_the_service checks those).
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "listKind": "ServiceMonitorList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def custom_values(watch: list[str]) -> dict[str, Any]:
    """Every value changed from its default."""
    return {
        "image": {"repository": "registry.example.com/ml/tfdata-operator", "tag": "9.9.9", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "serverImage": {"repository": "registry.example.com/ml/tfdata-server", "tag": "2.21-gpu"},
        "watchNamespaces": watch,
        "clusterDomain": "corp.internal",
        "networkPolicy": {"operatorNamespace": "infra", "operatorPodLabels": {"example.com/tier": "platform"}},
        "logFormat": "plain",
        "nameOverride": "tfdata",
        "serviceAccount": {"annotations": {"example.com/owner": "ml-platform"}},
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"cpu": None, "memory": "1Gi"}},
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
        "healthPort": 9090,
        "podAnnotations": {"example.com/team": "ml"},
        "podLabels": {"example.com/tier": "platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
        "priorityClassName": "",
        "metrics": {
            "enabled": True,
            "port": 8443,
            "serviceMonitor": {"enabled": True, "path": "/healthz", "interval": "1m", "labels": {"release": "prom"}},
        },
    }


class Helm:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp = env, tmp

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["helm", *args], env=self.env, capture_output=True, text=True, timeout=120, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited with {result.returncode}:\n{result.stderr}")
        return result

    def values_file(self, values: dict[str, Any]) -> str:
        path = self.tmp / f"values-{secrets.token_hex(3)}.yaml"
        path.write_text(yaml.safe_dump(values))
        return str(path)

    def template(self, namespace: str, values: dict[str, Any] | None = None, *args: str) -> list[dict[str, Any]]:
        extra = ["-f", self.values_file(values)] if values is not None else []
        text = self.run("template", "rel", str(CHART), "-n", namespace, *extra, *args).stdout
        return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def helm(kube_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(kube_env, tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="module")
def watched(kubectl: Kubectl, namespace: str) -> Iterator[list[str]]:
    """Three namespaces a release can be told to watch."""
    names = [f"{namespace}-w{i}" for i in range(3)]
    for name in names:
        kubectl.run("create", "namespace", name)
    yield names
    kubectl.run("delete", "namespace", *names, "--wait=false", "--ignore-not-found")


def kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return sorted((o["kind"], o["metadata"].get("namespace")) for o in objects)


# --- Lint, render, schema ----------------------------------------------------------------------


def test_crds_in_the_chart_match_the_source_of_truth() -> None:
    source = {p.name: p.read_bytes() for p in CRD_DIR.glob("*.yaml")}
    copied = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert source, f"no CRD in {CRD_DIR}"
    assert copied.keys() == source.keys(), "charts/tfdata-operator/crds/ differs from crds/: run `make sync-crds`"
    drifted = [name for name in source if copied[name] != source[name]]
    assert not drifted, f"charts/tfdata-operator/crds/{drifted} differ from crds/: run `make sync-crds`"


@pytest.mark.parametrize("values", ["default", "custom"])
def test_helm_lint_strict_passes(helm: Helm, values: str) -> None:
    extra = ["-f", helm.values_file(custom_values(["team-a", "team-b"]))] if values == "custom" else []
    result = helm.run("lint", "--strict", str(CHART), *extra)
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.fixture(scope="module")
def service_monitor_crd(kubectl: Kubectl) -> Iterator[None]:
    kubectl.apply(SERVICE_MONITOR_CRD)
    kubectl.run("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com", "--timeout=30s")
    yield
    kubectl.run("delete", "crd", "servicemonitors.monitoring.coreos.com", "--ignore-not-found")


def test_default_render_is_accepted_by_the_api_server(helm: Helm, kubectl: Kubectl, namespace: str) -> None:
    objects = helm.template(namespace)
    assert kinds(objects) == [
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
        ("Deployment", namespace),
        ("ServiceAccount", namespace),
    ]
    result = kubectl.run(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout


def test_custom_render_is_accepted_by_the_api_server(
    helm: Helm, kubectl: Kubectl, namespace: str, watched: list[str], service_monitor_crd: None
) -> None:
    objects = helm.template(namespace, custom_values(watched[:2]))
    assert kinds(objects) == sorted(
        [
            ("ClusterRole", None),  # only what kopf needs at cluster scope
            ("ClusterRoleBinding", None),
            ("Deployment", namespace),
            ("Role", watched[0]),
            ("Role", watched[1]),
            ("RoleBinding", watched[0]),
            ("RoleBinding", watched[1]),
            ("Service", namespace),
            ("ServiceAccount", namespace),
            ("ServiceMonitor", namespace),
        ]
    )
    result = kubectl.run(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout

    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/ml/tfdata-operator:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "TFDATA_NAMESPACES": f"{watched[0]} {watched[1]}",
        "TFDATA_SERVER_IMAGE": "registry.example.com/ml/tfdata-server:2.21-gpu",
        "TFDATA_CLUSTER_DOMAIN": "corp.internal",
        "TFDATA_LOG_FORMAT": "plain",
        "TFDATA_OPERATOR_NAMESPACE": "infra",
        "TFDATA_OPERATOR_POD_LABELS": "example.com/tier=platform",
    }
    assert container["args"] == ["run", "--liveness=http://0.0.0.0:9090/healthz"]
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"memory": "1Gi"}}
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]


@pytest.mark.parametrize(("metrics", "monitor"), [(False, False), (False, True), (True, False), (True, True)])
def test_service_monitor_only_with_both_flags(helm: Helm, metrics: bool, monitor: bool) -> None:
    values = {"metrics": {"enabled": metrics, "serviceMonitor": {"enabled": monitor}}}
    rendered = {o["kind"] for o in helm.template("ops", values)}
    assert ("Service" in rendered) == metrics
    assert ("ServiceMonitor" in rendered) == (metrics and monitor)


def test_service_monitor_scrapes_the_service(helm: Helm) -> None:
    objects = helm.template("ops", custom_values([]))
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "http", "path": "/healthz", "interval": "1m"}
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("http", 8443, "http")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "http", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_the_operator_tells_network_policies_its_own_namespace_and_pod_labels(helm: Helm) -> None:
    """By default, the peer each TFData-autoscaled service's NetworkPolicy admits is the operator pod itself."""
    (deployment,) = [o for o in helm.template("ops") if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TFDATA_OPERATOR_NAMESPACE"] == "ops"
    labels = dict(pair.split("=", 1) for pair in env["TFDATA_OPERATOR_POD_LABELS"].split(","))
    assert labels and labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert labels == deployment["spec"]["selector"]["matchLabels"]


BAD_VALUES = [
    pytest.param({"watchNamespace": ["a"]}, "additional properties 'watchNamespace' not allowed", id="typo-top"),
    pytest.param(
        {"metrics": {"serviceMonitor": {"enable": True}}},
        "at '/metrics/serviceMonitor': additional properties 'enable' not allowed",
        id="typo-nested",
    ),
    pytest.param({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array", id="string-not-list"),
    pytest.param({"healthPort": "8080"}, "at '/healthPort': got string, want integer", id="string-not-int"),
    pytest.param({"metrics": {"enabled": "yes"}}, "at '/metrics/enabled': got string, want boolean", id="not-bool"),
    pytest.param({"logFormat": "xml"}, "at '/logFormat'", id="enum"),
    pytest.param({"resources": {"limits": {"memory": "lots"}}}, "at '/resources/limits/memory'", id="quantity"),
    pytest.param({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0'", id="namespace-name"),
    pytest.param(
        {"networkPolicy": {"operatorNamespace": "Ops"}},
        "at '/networkPolicy/operatorNamespace'",
        id="operator-namespace",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES)
def test_the_schema_refuses_bad_values_naming_them(helm: Helm, values: dict[str, Any], message: str) -> None:
    result = helm.run("template", "rel", str(CHART), "-f", helm.values_file(values), check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_helm_install_refuses_a_typo_and_installs_nothing(helm: Helm, kubectl: Kubectl, namespace: str) -> None:
    result = helm.run("install", "typo", str(CHART), "-n", namespace, "--set", "metrics.enabeld=true", check=False)
    assert result.returncode != 0
    assert "at '/metrics': additional properties 'enabeld' not allowed" in result.stderr, result.stderr
    assert helm.run("status", "typo", "-n", namespace, check=False).returncode != 0
    assert not kubectl.json("get", "deployments,serviceaccounts", "-n", namespace, "-l", f"{INSTANCE}=typo")["items"]


# --- Install, upgrade, uninstall -----------------------------------------------------------------


def labelled(kubectl: Kubectl, release: str) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every object, of every listable kind, labelled with the release."""
    resources = kubectl.run("api-resources", "--verbs=list", "-o", "name").stdout.split()
    items = kubectl.json("get", ",".join(resources), "-A", "-l", f"{INSTANCE}={release}")["items"]
    return sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in items)


def rbac_objects(kubectl: Kubectl, release: str) -> set[tuple[str, str, str]]:
    return {
        o for o in labelled(kubectl, release) if o[0] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    }


@pytest.fixture
def crd_as_found(kubectl: Kubectl) -> Iterator[bool]:
    """Whether the CRD existed before the test; if it did not, Helm installs it, and it is deleted
    afterwards, so that the other modules install it from crds/ as they always do."""
    existed = kubectl.run("get", "crd", CRD_NAME, check=False).returncode == 0
    yield existed
    if not existed:
        kubectl.run("delete", "crd", CRD_NAME, "--ignore-not-found", "--timeout=60s")


@pytest.fixture
def release(helm: Helm, namespace: str) -> Iterator[str]:
    """A release name of its own (its cluster-scoped objects are named after it), uninstalled
    afterwards whatever happened: deleting the namespace would leave its cluster-scoped objects."""
    name = f"life-{secrets.token_hex(2)}"
    yield name
    helm.run("uninstall", name, "-n", namespace, "--ignore-not-found", "--wait", check=False)


def test_install_upgrade_uninstall_leaves_no_orphans(
    helm: Helm, kubectl: Kubectl, namespace: str, watched: list[str], crd_as_found: bool, release: str
) -> None:
    full = f"{release}-tfdata-operator"
    # The restricted Pod Security Standard: the operator's pod must be admitted under it.
    kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")

    first = {"watchNamespaces": watched[:2]}
    installed = helm.run("install", release, str(CHART), "-n", namespace, "-f", helm.values_file(first))
    notes = installed.stdout.split("NOTES:", 1)[1]
    assert f"kubectl get -n {watched[0]} tfdata -o wide" in notes and ".status.dispatcherAddress" in notes, notes
    # The first TFDataService the NOTES suggest is one the API server accepts.
    example = textwrap.dedent(notes.split("<<'YAML'", 1)[1].split("\n", 1)[1].split("  YAML\n", 1)[0])
    kubectl.run("apply", "--dry-run=server", "-n", watched[0], "-f", "-", input=example)
    managers = {
        f["manager"] for f in kubectl.json("get", "crd", CRD_NAME, "--show-managed-fields")["metadata"]["managedFields"]
    }
    if not crd_as_found:
        assert "helm" in managers, f"the CRD was not installed by helm: {managers}"
    assert rbac_objects(kubectl, release) == {
        ("ClusterRole", "", f"{full}-scanning"),
        ("ClusterRoleBinding", "", f"{full}-scanning"),
        ("Role", watched[0], full),
        ("Role", watched[1], full),
        ("RoleBinding", watched[0], full),
        ("RoleBinding", watched[1], full),
    }
    deployment = kubectl.json("get", "deployment", full, "-n", namespace)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert container["image"] == "tfdata-operator:0.1.0"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TFDATA_NAMESPACES"] == f"{watched[0]} {watched[1]}"
    assert env["TFDATA_SERVER_IMAGE"] == "tfdata-server:0.1.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTP"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod_spec["securityContext"]["runAsUser"] == pod_spec["securityContext"]["runAsGroup"] == 65532
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    # Pending (no node), but admitted: the namespace enforces the restricted standard.
    wait_for(
        lambda: kubectl.json("get", "pods", "-n", namespace, "-l", f"{INSTANCE}={release}")["items"],
        30,
        "the operator's pod to be created",
        show=lambda: kubectl.json("get", "replicasets", "-n", namespace, "-l", f"{INSTANCE}={release}")["items"],
    )

    # Another namespace list: the Role of the namespace no longer watched goes away.
    second = {"watchNamespaces": watched[1:], "metrics": {"enabled": True}}
    helm.run("upgrade", release, str(CHART), "-n", namespace, "-f", helm.values_file(second))
    assert rbac_objects(kubectl, release) == {
        ("ClusterRole", "", f"{full}-scanning"),
        ("ClusterRoleBinding", "", f"{full}-scanning"),
        ("Role", watched[1], full),
        ("Role", watched[2], full),
        ("RoleBinding", watched[1], full),
        ("RoleBinding", watched[2], full),
    }
    env = {
        e["name"]: e["value"]
        for e in kubectl.json("get", "deployment", full, "-n", namespace)["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env["TFDATA_NAMESPACES"] == f"{watched[1]} {watched[2]}"
    assert kubectl.run("get", "service", full, "-n", namespace, check=False).returncode == 0

    # Every namespace: one ClusterRole, no Role left anywhere.
    helm.run("upgrade", release, str(CHART), "-n", namespace, "--set", "metrics.enabled=true")
    assert rbac_objects(kubectl, release) == {("ClusterRole", "", full), ("ClusterRoleBinding", "", full)}

    # Every object of the release carries its label, so the search below would find any left over.
    before = labelled(kubectl, release)
    manifest = [d for d in yaml.safe_load_all(helm.run("get", "manifest", release, "-n", namespace).stdout) if d]
    released = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in manifest}
    assert released <= set(before), f"not labelled: {released - set(before)}"
    # What controllers made from them (with the labels copied) is there too, until garbage collection.
    derived = {kind for kind, _, _ in before} - {kind for kind, _, _ in released}
    assert {"ReplicaSet", "Pod"} <= derived <= {"ReplicaSet", "Pod", "Endpoints", "EndpointSlice"}, before
    helm.run("uninstall", release, "-n", namespace, "--wait")
    # The Deployment's ReplicaSets and pods go by garbage collection, after helm returned.
    wait_for(
        lambda: not labelled(kubectl, release),
        60,
        "every object of the release to be gone",
        show=lambda: labelled(kubectl, release),
    )
    # Helm never deletes what it installed from crds/ (deleting a CRD deletes every
    # TFDataService in the cluster): it stays, as the NOTES tell the user.
    assert kubectl.run("get", "crd", CRD_NAME, check=False).returncode == 0, "the CRD is gone after uninstall"
