"""The test cluster is a real Kubernetes: controllers, scheduler, garbage collector,
token issuer and RBAC behave as on any cluster, so the operator's tests can rely on them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fixtures.support import Kubectl, kubelet_nodes, wait_for

T = TypeVar("T")

# No kubelet runs (kwok's node is tainted and runs nothing), so no image is ever pulled.
IMAGE = "registry.invalid/never-pulled:1"


def pod_template(app: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
    }


def pods(kubectl: Kubectl, namespace: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json("get", "pods", "-n", namespace, "-l", f"app={app}")["items"]
    return items


def summary(pod: dict[str, Any]) -> dict[str, Any]:
    """What a person would look at: name, owner, phase, and the scheduler's verdict."""
    scheduled = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    return {
        "name": pod["metadata"]["name"],
        "owner": [o["kind"] for o in pod["metadata"].get("ownerReferences", [])],
        "phase": pod["status"].get("phase"),
        "scheduled": scheduled[0].get("reason") if scheduled else None,
    }


def token_kubeconfig(kubectl: Kubectl, token: str, path: Path) -> str:
    """A kubeconfig for the same cluster that holds nothing but `token`: no admin
    client cert or token to fall back on."""
    config = kubectl.json("config", "view", "--minify", "--raw")
    config["users"][0]["user"] = {"token": token}
    path.write_text(json.dumps(config))
    return str(path)


def test_api_server_is_ready(kubectl: Kubectl) -> None:
    assert kubectl.run("get", "--raw", "/readyz").stdout.strip() == "ok"


def test_versions_are_stamped(kubectl: Kubectl) -> None:
    # Unstamped builds report v0.0.0-master, which fails Helm's kubeVersion checks.
    versions = kubectl.json("version")
    for side in ("clientVersion", "serverVersion"):
        assert re.fullmatch(r"v1\.\d+\.\d+.*", versions[side]["gitVersion"]), versions


def test_deployment_creates_pods_the_scheduler_cannot_place(kubectl: Kubectl, namespace: str) -> None:
    if kubelet_nodes(kubectl.json("get", "nodes")):
        pytest.skip("this cluster has nodes (an existing cluster such as kind): its pods can be placed")
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "smoke", "namespace": namespace},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "smoke"}}, "template": pod_template("smoke")},
        }
    )
    # Deployment -> ReplicaSet -> Pods needs two controllers; "Unschedulable"
    # needs the scheduler to have looked at them (the only node, kwok's, has a taint they do not tolerate).
    seen = wait_for(
        lambda: [summary(p) for p in pods(kubectl, namespace, "smoke")],
        60,
        "2 Pending, Unschedulable pods owned by a ReplicaSet",
        until=lambda s: (
            len(s) == 2
            and all(
                p["owner"] == ["ReplicaSet"] and p["phase"] == "Pending" and p["scheduled"] == "Unschedulable"
                for p in s
            )
        ),
    )
    assert len(seen) == 2


def test_statefulset_creates_its_pods(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {
                "replicas": 2,
                "serviceName": "web",
                "podManagementPolicy": "Parallel",  # OrderedReady would wait for web-0 to run
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template("web"),
            },
        }
    )
    seen = wait_for(
        lambda: [summary(p) for p in pods(kubectl, namespace, "web")],
        60,
        "pods web-0 and web-1 owned by the StatefulSet",
        until=lambda s: (
            sorted(p["name"] for p in s) == ["web-0", "web-1"] and all(p["owner"] == ["StatefulSet"] for p in s)
        ),
    )
    assert all(p["phase"] == "Pending" for p in seen), seen


def test_deleting_an_owner_garbage_collects_what_it_owns(kubectl: Kubectl, namespace: str) -> None:
    owner = kubectl.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": namespace}}
    )
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "owned", "namespace": namespace, "ownerReferences": [reference]},
        }
    )
    kubectl.run("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: kubectl.get("configmap", "owned", "-n", namespace) is None,
        60,
        "the garbage collector to delete configmap/owned",
    )


def test_created_token_authenticates_as_its_service_account(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    token = kubectl.run("create", "token", "default", "-n", namespace, "--duration=10m").stdout.strip()
    as_token = token_kubeconfig(kubectl, token, tmp_path / "token.kubeconfig")
    review = kubectl.json("--kubeconfig", as_token, "auth", "whoami")
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:default"


def test_rbac_denies_an_unprivileged_service_account(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    kubectl.run("create", "serviceaccount", "unprivileged", "-n", namespace)
    user = f"system:serviceaccount:{namespace}:unprivileged"

    def can_i(verb: str, resource: str) -> str:
        return kubectl.run("auth", "can-i", verb, resource, "-n", namespace, f"--as={user}", check=False).stdout.strip()

    assert can_i("get", "secrets") == "no"
    # A grant is honoured, so the "no" above is RBAC deciding rather than a broken authorizer.
    kubectl.run("create", "role", "read-configmaps", "--verb=get,list", "--resource=configmaps", "-n", namespace)
    binding = ["rolebinding", "read-configmaps", "--role=read-configmaps", f"--serviceaccount={namespace}:unprivileged"]
    kubectl.run("create", *binding, "-n", namespace)
    wait_for(
        lambda: can_i("list", "configmaps"), 30, "RBAC to allow the granted verb", until=lambda seen: seen == "yes"
    )
    assert can_i("get", "secrets") == "no"

    # The same through a real token, not impersonation.
    token = kubectl.run("create", "token", "unprivileged", "-n", namespace, "--duration=10m").stdout.strip()
    as_token = token_kubeconfig(kubectl, token, tmp_path / "unprivileged.kubeconfig")
    denied = kubectl.run("--kubeconfig", as_token, "get", "secrets", "-n", namespace, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr, denied
    kubectl.run("--kubeconfig", as_token, "get", "configmaps", "-n", namespace)
