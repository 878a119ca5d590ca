"""The whole chain: operator -> StatefulSets -> scheduler -> node -> tfdata-server ->
TensorFlow, read by a real tf.data client through the address in the status."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from support import OperatorProcess

if TYPE_CHECKING:
    from conftest import Client, Kubectl

READ_EVERYTHING = """
import json, sys
import tensorflow as tf
dataset = tf.data.Dataset.range(200).apply(tf.data.experimental.service.distribute(
    processing_mode="distributed_epoch", service=sys.argv[1], job_name="smoke"))
print(json.dumps([int(x) for x in dataset.as_numpy_iterator()]))
"""


def test_a_dynamic_service_serves_every_element_exactly_once(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, client: Client
) -> None:
    kubectl.apply(
        {
            "apiVersion": "tfdata.dev/v1alpha1",
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
