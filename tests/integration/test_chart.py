"""The Helm chart with the real helm and a real API server: lint, what it renders, what its
schema refuses, and install, upgrade and uninstall leaving nothing behind.

No node of the test cluster takes the operator's pod (kwok's is tainted), so it stays Pending:
the tests check the objects the chart creates, not a running operator (test_rbac.py runs the
operator with the chart's identity).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tfdata_operator import cli
from tfdata_operator.api.identity import KIND
from tfdata_operator.plan import children
from tfdata_operator.render.builders import BuildSettings

import devcluster
from fixtures.manifests import API_VERSION
from fixtures.support import CRD_DIR, ROOT, Gone, Kubectl, free_port, logged_errors, wait_for

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
        "allowHostPathVolumes": True,
        "drainMaxWaitSeconds": 0,
        "kueue": {"enabled": True},
        "aggregateRoles": {"enabled": False},
        "clusterDomain": "corp.internal",
        "networkPolicy": {"operatorNamespace": "infra", "operatorPodLabels": {"example.com/tier": "platform"}},
        "egressNetworkPolicy": {
            "enabled": True,
            "apiServer": {"cidr": "172.18.0.0/16", "except": ["172.18.0.128/25"], "ports": [6443]},
            "serverHealthPorts": [8080, 9000],
            "dns": {"to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}]},
        },
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
            "serviceMonitor": {"enabled": True, "interval": "1m", "labels": {"release": "prom"}},
        },
        "dashboard": {"enabled": True, "label": "grafana_dashboard", "labelValue": "1",
                      "annotations": {"grafana_folder": "ML"}},
    }  # fmt: skip


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
def service_monitor_crd(kubectl: Kubectl, cluster: devcluster.Cluster) -> Iterator[None]:
    kubectl.apply(SERVICE_MONITOR_CRD)
    devcluster.wait_condition(cluster, "crd/servicemonitors.monitoring.coreos.com", "Established", 30)
    yield
    kubectl.run("delete", "crd", "servicemonitors.monitoring.coreos.com", "--ignore-not-found")


def test_default_render_is_accepted_by_the_api_server(helm: Helm, kubectl: Kubectl, namespace: str) -> None:
    objects = helm.template(namespace)
    assert kinds(objects) == [
        ("ClusterRole", None),
        ("ClusterRole", None),  # the two aggregated into view, edit and admin
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
            ("ConfigMap", namespace),
            ("Deployment", namespace),
            ("NetworkPolicy", namespace),
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
        # Pods of an image of the user's get the server program from the operator's own image.
        "TFDATA_INJECTOR_IMAGE": "registry.example.com/ml/tfdata-operator:9.9.9",
        "TFDATA_CLUSTER_DOMAIN": "corp.internal",
        "TFDATA_LOG_FORMAT": "plain",
        "TFDATA_ALLOW_HOST_PATH_VOLUMES": "true",
        "TFDATA_DRAIN_MAX_WAIT_SECONDS": "0",
        "TFDATA_KUEUE": "true",
        "TFDATA_OPERATOR_NAMESPACE": "infra",
        "TFDATA_OPERATOR_POD_LABELS": "example.com/tier=platform",
    }
    assert container["args"] == ["run", "--liveness=http://0.0.0.0:9090/healthz", "--metrics-port=8443"]
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
    """ServiceMonitor -> Service port "metrics" -> the container port "metrics" -> the port the
    Deployment's args tell the operator to serve /metrics on."""
    objects = helm.template("ops", custom_values([]))
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "1m"}
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 8443, "metrics")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    assert "--metrics-port=8443" in container["args"]
    assert {"name": "http", "containerPort": 9090, "protocol": "TCP"} in container["ports"]  # the liveness probe's
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_the_dashboard_configmap_carries_the_dashboard_and_the_sidecars_label(helm: Helm) -> None:
    assert "ConfigMap" not in {o["kind"] for o in helm.template("ops")}, "the dashboard is off by default"
    (configmap,) = [o for o in helm.template("ops", custom_values([])) if o["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "ML"}
    (text,) = configmap["data"].values()
    assert json.loads(text) == json.loads((CHART / "dashboards" / "tfdata-operator.json").read_text())


def test_the_same_port_for_metrics_and_health_is_refused(helm: Helm) -> None:
    result = helm.run("template", "rel", str(CHART), "--set", "metrics.port=8080", check=False)
    assert result.returncode != 0 and "metrics.port and healthPort are both 8080" in result.stderr, result.stderr


def test_the_operator_run_as_the_deployment_says_serves_metrics_on_the_charts_port(
    helm: Helm, kubectl: Kubectl, kube_env: dict[str, str], namespace: str, crd: None, tmp_path: Path
) -> None:
    """The operator started with the rendered Deployment's own command, args and environment serves
    Prometheus metrics on the port the metrics Service targets. The cluster runs no container (its
    pods never start), and the API server will not proxy a Service to a process on the loopback:
    so the process is scraped directly, on the port the chart's wiring names."""
    values = {"watchNamespaces": [namespace], "healthPort": free_port(), "metrics": {"enabled": True,
              "port": free_port()}}  # fmt: skip
    objects = helm.template(namespace, values)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = ports[service["spec"]["ports"][0]["targetPort"]]
    command = [str(Path(sys.executable).with_name(container["command"][0])), *container["args"]]
    env = {**kube_env, **{e["name"]: e["value"] for e in container["env"]}, "PYTHONUNBUFFERED": "1",
           # In the pod it listens on every address; here only on the loopback.
           "TFDATA_METRICS_ADDRESS": "127.0.0.1", "TFDATA_RESYNC_SECONDS": "2"}  # fmt: skip
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:

        def scrape() -> dict[str, float]:
            if proc.poll() is not None:
                raise Gone(f"the operator exited with {proc.returncode}: {log.read_text()}")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text = response.read().decode()
            return {s.name + str(sorted(s.labels.items())): s.value
                    for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip

        kubectl.run("apply", "-n", namespace, "-f", "-", input=SCRAPED_SERVICE)
        labels = {"namespace": namespace, "name": "scraped", "result": "changed"}
        changed = f"tfdata_operator_reconciles_total{sorted(labels.items())}"
        samples = wait_for(
            scrape,
            60,
            "the operator's /metrics to count a changed reconcile and the services by Ready",
            until=lambda seen: (
                seen.get(changed, 0) >= 1 and seen.get("tfdata_operator_services[('ready', 'False')]", 0) >= 1
            ),
            show=lambda: log.read_text()[-3000:],
        )
        assert samples.get("tfdata_operator_api_requests_total[('code', '200'), ('verb', 'patch')]", 0) >= 1
        assert "tfdata_operator_queue_depth[]" in samples
    finally:
        kubectl.run("delete", "-n", namespace, "tfdataservice", "scraped", "--ignore-not-found", "--wait=false")
        died = proc.poll()
        proc.terminate()
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    text = log.read_text()
    assert died is None, f"the operator had exited with {died} before the test ended:\n{text[-3000:]}"
    assert code == 0, f"the operator exited with {code} on SIGTERM:\n{text[-3000:]}"
    assert "Traceback" not in text and not logged_errors(text), text[-3000:]


SCRAPED_SERVICE = f"""
apiVersion: {API_VERSION}
kind: TFDataService
metadata:
  name: scraped
spec:
  shardingPolicy: DYNAMIC
"""


def test_the_operator_tells_network_policies_its_own_namespace_and_pod_labels(helm: Helm) -> None:
    """By default, the peer each service's NetworkPolicy admits is the operator pod itself."""
    (deployment,) = [o for o in helm.template("ops") if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TFDATA_OPERATOR_NAMESPACE"] == "ops"
    labels = dict(pair.split("=", 1) for pair in env["TFDATA_OPERATOR_POD_LABELS"].split(","))
    assert labels and labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert labels == deployment["spec"]["selector"]["matchLabels"]


@dataclass(frozen=True)
class Destination:
    """Where a connection from the operator's pod goes (after a Service's address is translated)."""

    ip: str
    port: int
    protocol: str = "TCP"
    pod_labels: dict[str, str] | None = None  # None: not a pod (a node, the API server, outside)
    namespace: str = ""


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, and matchExpressions with In) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _peer_admits(peer: dict[str, Any], to: Destination, own_namespace: str) -> bool:
    if "ipBlock" in peer:
        address, block = ipaddress.ip_address(to.ip), peer["ipBlock"]
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", [])
        )
    if to.pod_labels is None:
        return False
    if "namespaceSelector" in peer:
        in_namespace = _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": to.namespace})
    else:
        in_namespace = to.namespace == own_namespace
    return in_namespace and _selects(peer.get("podSelector", {}), to.pod_labels)


def egress_admits(policy: dict[str, Any], to: Destination) -> bool:
    """Whether a NetworkPolicy's egress rules let the pods it selects connect to ``to``."""
    for rule in policy["spec"].get("egress", []):
        ports = rule.get("ports")
        if ports is not None and not any(
            p.get("protocol", "TCP") == to.protocol and p.get("port") in (None, to.port) for p in ports
        ):
            continue
        peers = rule.get("to")
        if peers is None or any(_peer_admits(peer, to, policy["metadata"]["namespace"]) for peer in peers):
            return True
    return False


def server_pods(namespace: str) -> list[tuple[dict[str, str], dict[str, int]]]:
    """The labels and named container ports of the pods the operator creates for a default TFDataService."""
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "svc", "namespace": namespace},
        "spec": {"shardingPolicy": "DYNAMIC"},
    }
    pods = []
    for statefulset in cli.render_document(doc, "test", cli.DEFAULT_SERVER_IMAGE, BuildSettings()):
        if statefulset["kind"] == "StatefulSet":
            template = statefulset["spec"]["template"]
            (container,) = template["spec"]["containers"]
            pods.append((template["metadata"]["labels"], {p["name"]: p["containerPort"] for p in container["ports"]}))
    assert len(pods) == 2, "a dispatcher and workers"
    return pods


def test_the_operators_egress_policy_admits_the_api_server_the_health_ports_and_dns_only(
    helm: Helm, kubectl: Kubectl, namespace: str
) -> None:
    """egressNetworkPolicy.enabled: the operator's pod reaches the API server, the health port of
    every dispatcher and worker pod it creates (the chart's and the CRD's default ports agree), and
    the cluster DNS; not the cloud metadata server on any port, a kubelet, or a server's gRPC port."""
    assert "NetworkPolicy" not in {o["kind"] for o in helm.template(namespace)}, "off by default"
    objects = helm.template(namespace, {"egressNetworkPolicy": {"enabled": True}})
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert policy["spec"]["policyTypes"] == ["Egress"], "ingress (the kubelet's probe, a Prometheus) is untouched"
    assert _selects(policy["spec"]["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    result = kubectl.run("apply", "--dry-run=server", "-f", "-", input=json.dumps(policy))
    assert "(server dry run)" in result.stdout, result.stdout

    def admits(to: Destination) -> bool:
        return egress_admits(policy, to)

    assert admits(Destination("172.18.0.2", 6443)), "a kubeadm or kind API server"
    assert admits(Destination("34.118.224.1", 443)), "a managed cluster's API server"
    for port in (80, 443, 6443, 8080, 53):
        assert not admits(Destination("169.254.169.254", port)), f"the metadata server on port {port}"
    assert not admits(Destination("169.254.169.254", 53, "UDP"))
    assert not admits(Destination("172.18.0.3", 10250)), "a node's kubelet"
    assert not admits(Destination("10.244.1.9", 8080, pod_labels={"app": "other"}, namespace="team-a"))
    kube_dns = {"k8s-app": "kube-dns"}
    assert admits(Destination("10.244.0.3", 53, "UDP", kube_dns, "kube-system"))
    assert admits(Destination("10.244.0.3", 53, "TCP", kube_dns, "kube-system"))
    assert not admits(Destination("10.244.0.3", 53, "UDP", kube_dns, "team-a")), "a look-alike elsewhere"
    for labels, ports in server_pods("team-a"):
        assert admits(Destination("10.244.1.7", ports["health"], pod_labels=labels, namespace="team-a")), labels
        assert not admits(Destination("10.244.1.7", ports["grpc"], pod_labels=labels, namespace="team-a")), labels

    # With watchNamespaces, only the servers of those namespaces; another health port once listed.
    values = {
        "watchNamespaces": ["team-a"],
        "egressNetworkPolicy": {"enabled": True, "serverHealthPorts": [8080, 9000]},
    }
    (narrowed,) = [o for o in helm.template(namespace, values) if o["kind"] == "NetworkPolicy"]
    for labels, _ in server_pods("team-a"):
        assert egress_admits(narrowed, Destination("10.244.1.7", 9000, pod_labels=labels, namespace="team-a"))
    for labels, ports in server_pods("team-b"):
        to = Destination("10.244.2.7", ports["health"], pod_labels=labels, namespace="team-b")
        assert admits(to) and not egress_admits(narrowed, to), "a namespace not watched"


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
    pytest.param(
        {"allowHostPathVolumes": "yes"}, "at '/allowHostPathVolumes': got string, want boolean", id="host-path-not-bool"
    ),
    pytest.param({"drainMaxWaitSeconds": -1}, "at '/drainMaxWaitSeconds'", id="drain-bound-negative"),
    pytest.param({"resources": {"limits": {"memory": "lots"}}}, "at '/resources/limits/memory'", id="quantity"),
    pytest.param({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0'", id="namespace-name"),
    pytest.param({"replicaCount": 0}, "at '/replicaCount'", id="no-replica"),
    pytest.param({"leaderElection": {"leaseDuration": 10}}, "at '/leaderElection'", id="typo-election"),
    pytest.param(
        {"networkPolicy": {"operatorNamespace": "Ops"}},
        "at '/networkPolicy/operatorNamespace'",
        id="operator-namespace",
    ),
    pytest.param(
        {"egressNetworkPolicy": {"apiServer": {"cidr": "kubernetes.default"}}},
        "at '/egressNetworkPolicy/apiServer/cidr'",
        id="egress-cidr",
    ),
]


def granted_rules(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("enabled", [False, True], ids=["default", "kueue"])
def test_kueue_permissions_are_granted_only_with_kueue_enabled(helm: Helm, namespace: str, enabled: bool) -> None:
    """kueue.enabled grants what children.kueue_rules() says (Workloads where the operator watches; flavors and
    priority classes at cluster scope), in both RBAC layouts; off, nothing of Kueue's."""
    namespaced, cluster = children.kueue_rules()
    for values in ({}, {"watchNamespaces": [namespace]}):
        objects = helm.template(namespace, {**values, "kueue": {"enabled": enabled}})
        roles = [o for o in objects if o["kind"] in ("Role", "ClusterRole") and "aggregate" not in str(o["metadata"])]
        found = set().union(*(granted_rules(r["rules"]) for r in roles))
        kueue_rules = {rule for rule in found if rule[0] == "kueue.x-k8s.io"}
        assert kueue_rules == ((namespaced | cluster) if enabled else set()), values


def test_two_replicas_elect_a_leader_on_a_lease_in_the_release_namespace(
    helm: Helm, kubectl: Kubectl, namespace: str
) -> None:
    objects = helm.template(namespace, {"replicaCount": 2})
    roles = [o for o in objects if o["kind"] in ("Role", "RoleBinding")]
    assert kinds(roles) == [("Role", namespace), ("RoleBinding", namespace)]
    (role,) = [o for o in roles if o["kind"] == "Role"]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert granted == children.leader_election_rules()
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate", "a new pod starts as a standby"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"], "a standby on the leader's node would go down with it"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["TFDATA_LEADER_ELECTION"] == "true"
    assert env["TFDATA_LEADER_ELECTION_NAMESPACE"] == namespace
    assert env["TFDATA_LEADER_ELECTION_LEASE"] == "rel-tfdata-operator"
    result = kubectl.run(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout
    # One replica: no election, no Lease Role, as before; asked for, one replica elects too.
    single = helm.template(namespace)
    assert not [o for o in single if o["kind"] == "Role"]
    assert "TFDATA_LEADER_ELECTION" not in {
        e["name"]
        for o in single
        if o["kind"] == "Deployment"
        for e in o["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    asked = helm.template(namespace, {"leaderElection": {"enabled": True}})
    assert [o["kind"] for o in asked if o["kind"] == "Role"] == ["Role"]


@pytest.mark.parametrize(
    ("election", "message"),
    [
        ({"leaseDurationSeconds": 5, "renewDeadlineSeconds": 5}, "must be above renewDeadlineSeconds"),
        ({"renewDeadlineSeconds": 2, "retryPeriodSeconds": 2}, "must be above 1.2 times retryPeriodSeconds"),
    ],
)
def test_election_timings_that_cannot_work_are_refused(helm: Helm, election: dict[str, Any], message: str) -> None:
    values = {"replicaCount": 2, "leaderElection": election}
    result = helm.run("template", "rel", str(CHART), "-f", helm.values_file(values), check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


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
def release(helm: Helm, namespace: str) -> Iterator[str]:
    """A release name of its own (its cluster-scoped objects are named after it), uninstalled
    afterwards whatever happened: deleting the namespace would leave its cluster-scoped objects."""
    name = f"life-{secrets.token_hex(2)}"
    yield name
    helm.run("uninstall", name, "-n", namespace, "--ignore-not-found", "--wait", check=False)


def test_install_upgrade_uninstall_leaves_no_orphans(
    helm: Helm, kubectl: Kubectl, namespace: str, watched: list[str], crd_absent: None, release: str
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
    assert "helm" in managers, f"the CRD was not installed by helm: {managers}"
    aggregated = {("ClusterRole", "", f"{full}-view"), ("ClusterRole", "", f"{full}-edit")}
    assert rbac_objects(kubectl, release) == aggregated | {
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
    assert env["TFDATA_ALLOW_HOST_PATH_VOLUMES"] == "false"
    assert env["TFDATA_DRAIN_MAX_WAIT_SECONDS"] == "3600"
    assert env["TFDATA_KUEUE"] == "false"
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
    assert rbac_objects(kubectl, release) == aggregated | {
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
    assert rbac_objects(kubectl, release) == aggregated | {("ClusterRole", "", full), ("ClusterRoleBinding", "", full)}

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
