"""The whole chain: operator -> StatefulSets -> scheduler -> node -> tfdata-server ->
TensorFlow, read by a real tf.data client through the address in the status."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from devcluster import node as nodeagent
from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, OperatorProcess

READ_EVERYTHING = """
import json, sys
import tensorflow as tf
dataset = tf.data.Dataset.range(200).apply(tf.data.experimental.service.distribute(
    processing_mode="distributed_epoch", service=sys.argv[1], job_name="smoke"))
print(json.dumps([int(x) for x in dataset.as_numpy_iterator()]))
"""


@dataclass(frozen=True)
class Client:
    """Runs Python programs (TensorFlow clients) where the cluster's names resolve."""

    state_dir: Path
    namespace: str

    def run(self, program: str, *args: str, timeout: float = 180) -> str:
        """The program's stdout; fails showing its output if it exits non-zero or runs too long."""
        with nodeagent.client_netns(self.state_dir, self.namespace) as prefix:
            try:
                result = subprocess.run(
                    [*prefix, "python", "-c", program, *args],
                    env=nodeagent.client_env(),
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired as e:
                out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
                err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
                raise AssertionError(
                    f"client ran over {timeout:.0f}s\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
                ) from e
        if result.returncode != 0:
            raise AssertionError(
                f"client exited with {result.returncode}\n"
                f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-5000:]}"
            )
        return result.stdout


@pytest.fixture(scope="module")
def client(node_state_dir: Path, namespace: str) -> Client:
    return Client(node_state_dir, namespace)


def tf_version() -> str:
    """The TensorFlow the dev node's servers run: this venv's (the node runs pods from it)."""
    return metadata.version("tensorflow-cpu")


def test_a_dynamic_service_serves_every_element_exactly_once(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, client: Client
) -> None:
    kubectl.apply(
        {
            "apiVersion": API_VERSION,
            "kind": "TFDataService",
            "metadata": {"name": "smoke", "namespace": namespace},
            "spec": {
                "shardingPolicy": "DYNAMIC",
                "dispatcher": {"faultTolerantMode": True},
                "workers": {"replicas": 2},
            },
        }
    )

    waited = kubectl.run(
        "wait", "--for=condition=Ready", "tfdata/smoke", "-n", namespace, "--timeout=300s", check=False, timeout=310
    )
    assert waited.returncode == 0, (
        f"{waited.stderr}\n{kubectl.run('get', 'tfdata,pods,pvc', '-n', namespace, '-o', 'wide').stdout}\n"
        f"{json.dumps(kubectl.json('get', 'tfdata', 'smoke', '-n', namespace).get('status'), indent=1)}"
    )
    address = kubectl.json("get", "tfdata", "smoke", "-n", namespace)["status"]["dispatcherAddress"]

    elements = json.loads(client.run(READ_EVERYTHING, address).strip().splitlines()[-1])

    assert sorted(elements) == list(range(200))

    # What the servers run reaches the status once per dispatcher pod, and `kubectl get -o wide`.
    deadline, server = time.monotonic() + 60, None
    while time.monotonic() < deadline and not server:
        server = kubectl.json("get", "tfdata", "smoke", "-n", namespace)["status"].get("server")
        time.sleep(1)
    assert server, f"no status.server within 60 s: {kubectl.json('get', 'tfdata', 'smoke', '-n', namespace)['status']}"
    assert server["tensorflowVersion"] == tf_version() and server["opCount"] > 1000, server
    assert server["pod"].startswith("smoke-dispatcher-0/"), server
    wide = kubectl.run("get", "tfdata", "smoke", "-n", namespace, "-o", "wide").stdout
    assert "TENSORFLOW" in wide and tf_version() in wide, wide
    # ... and the client ConfigMap, for trainers.
    deadline, data = time.monotonic() + 60, {}
    while time.monotonic() < deadline and "TFDATA_SERVER_TENSORFLOW" not in data:
        data = kubectl.json("get", "configmap", "smoke-client", "-n", namespace).get("data") or {}
        time.sleep(1)
    assert data.get("TFDATA_SERVER_TENSORFLOW") == tf_version(), data
