"""The operator image runs the operator against a real control plane, and holds no TensorFlow.

The control plane is the dev cluster's (devcluster: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler on 127.0.0.1), in its own state dir under .local/; the operator container
shares the host's network to reach it and reads a mounted kubeconfig, as uid 65532 on a
read-only root filesystem with a tmpfs at /tmp and no capabilities.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import devcluster
from fixtures.docker import Docker, http_status
from fixtures.support import Gone, Kubectl, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "dynamic.yaml"
KUBECONFIG_IN_CONTAINER = "/etc/tfdata/kubeconfig"
OPERATOR_UID = "65532"
# Generous: the machine may be shared; a healthy run takes seconds.
RECONCILE_TIMEOUT = 120.0
START_TIMEOUT = 120.0


def get(kubectl: Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    return kubectl.get(kind, name, "-n", namespace)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def operator(
    docker: Docker,
    operator_image: str,
    cluster: devcluster.Cluster,
    crd: None,
    kubectl: Kubectl,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """`tfdata-operator run` in its container, watching `namespace`; yields the container's name."""
    # Readable by uid 65532: the admin kubeconfig is private to the user who started the cluster.
    kubeconfig = tmp_path_factory.mktemp("operator") / "kubeconfig"
    shutil.copyfile(cluster.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)
    port = free_port()
    name = docker.name("operator")
    docker.run(
        "run", "-d", "--name", name, *docker.label,
        "--network", "host", "--user", OPERATOR_UID, "--read-only", "--tmpfs", "/tmp",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--volume", f"{kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro", "--env", f"KUBECONFIG={KUBECONFIG_IN_CONTAINER}",
        "--env", "TFDATA_RESYNC_SECONDS=5",
        operator_image, "run", f"--namespace={namespace}", "--log-format=plain",
        f"--liveness=http://127.0.0.1:{port}/healthz",
    )  # fmt: skip

    def alive() -> bool:
        if not docker.running(name):
            raise Gone("the operator's container stopped")
        return http_status(f"http://127.0.0.1:{port}/healthz") == 200

    wait_for(alive, START_TIMEOUT, "the operator's liveness endpoint", show=lambda: docker.logs(name))
    yield name
    # Delete while the operator still runs, then stop it the way Kubernetes does (SIGTERM).
    kubectl.run("delete", "-f", str(EXAMPLE), "-n", namespace, "--ignore-not-found", "--wait=false")
    docker.run("stop", "--time", "30", name, timeout=60)
    state = docker.inspect(name)["State"]
    log = docker.run("logs", name).stderr
    assert state["ExitCode"] == 0, f"the operator exited with {state['ExitCode']}\n{docker.logs(name)}"
    assert "Traceback" not in log, docker.logs(name, tail=200)


def test_image_runs_as_non_root_by_default(docker: Docker, operator_image: str) -> None:
    config = docker.inspect(operator_image, kind="image")["Config"]
    assert config["User"].split(":")[0] == OPERATOR_UID, config["User"]
    assert config["Entrypoint"] == ["tfdata-operator"]
    assert config["Cmd"] == ["run"]
    whoami = docker.run("run", "--rm", "--entrypoint", "id", operator_image).stdout
    assert whoami.startswith(f"uid={OPERATOR_UID}(nonroot) gid={OPERATOR_UID}(nonroot)"), whoami


def test_image_has_no_tensorflow(docker: Docker, operator_image: str) -> None:
    python = ("run", "--rm", "--entrypoint", "python", operator_image, "-c")
    # The control: the same interpreter imports the operator and kopf.
    docker.run(*python, "import kopf, tfdata_operator.cli")
    result = docker.run(*python, "import tensorflow", check=False)
    assert result.returncode != 0, "tensorflow imported in the operator image"
    assert "No module named 'tensorflow'" in result.stderr, result.stderr


def test_operator_reconciles_the_dynamic_example(
    docker: Docker, kubectl: Kubectl, namespace: str, operator: str, version: str
) -> None:
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    kubectl.run("apply", "-f", str(EXAMPLE), "-n", namespace)

    def seen() -> str:
        service = get(kubectl, namespace, "tfdataservice", name) or {}
        statefulsets = kubectl.run("get", "statefulsets", "-n", namespace, check=False).stdout
        return f"status: {service.get('status')}\nstatefulsets:\n{statefulsets}\n{docker.logs(operator)}"

    def reconciled() -> dict[str, Any] | None:
        service = get(kubectl, namespace, "tfdataservice", name)
        address = ((service or {}).get("status") or {}).get("dispatcherAddress")
        dispatcher = get(kubectl, namespace, "statefulset", f"{name}-dispatcher")
        worker = get(kubectl, namespace, "statefulset", f"{name}-worker")
        return (
            {"address": address, "dispatcher": dispatcher, "worker": worker}
            if address and dispatcher and worker
            else None
        )

    found = wait_for(
        reconciled, RECONCILE_TIMEOUT, f"the StatefulSets and status.dispatcherAddress of {name}", show=seen
    )
    assert found["address"].startswith(f"grpc://{name}-dispatcher.{namespace}.svc."), found["address"]
    # The operator's default server image is the tag `make images` built next to it.
    for sts in (found["dispatcher"], found["worker"]):
        image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"tfdata-server:{version}", image
