"""examples/multi-worker/ on a real kind cluster, run as its README says: the folder applied with
trainers.yaml's image set to a trainer image (``tfdata-trainer``: the server image plus tf-keras,
images/trainer, which `make images` builds and kind/cluster.sh loads), then `kubectl wait` for the
service. The indexed Job's two trainer pods find each other under the headless Service through the
cluster's DNS, and train one tf-keras model under MultiWorkerMirroredStrategy, reading the DYNAMIC
service in lockstep through its NetworkPolicy (enforced here, unlike on the dev node): the Job
completes, both pods end with the same losses and weights, the model learned.

tests/e2e/test_multi_worker.py runs the same folder on the dev node (DYNAMIC and DATA), and
tests/server/test_lockstep.py checks the scripts' batches element by element.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kindpods import logs

from tfdata_operator import __version__

from fixtures.multiworker import EXAMPLE, JOB, job_status, one_model, wait_for_job
from fixtures.support import Kubectl

pytestmark = pytest.mark.kind

IMAGE = f"tfdata-trainer:{__version__}"  # images/images.sh builds it, kind/cluster.sh loads it
# The service Ready, two trainers each importing TensorFlow and running 3 epochs of 64 steps, on a
# 2-core machine that runs three kind nodes.
JOB_TIMEOUT = 600.0


def trainers_on(image: str) -> list[dict[str, Any]]:
    """trainers.yaml with the image set, as its README asks, and nothing else changed."""
    documents = [d for d in yaml.safe_load_all((EXAMPLE / "trainers.yaml").read_text()) if d]
    (job,) = [d for d in documents if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "my-trainer:latest", container  # the example as written
    container["image"] = image
    return documents


def test_the_multi_worker_example_trains_one_model_in_two_trainer_pods_on_kind(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.run("apply", "-n", namespace, "-f", str(EXAMPLE / "service.yaml"), "-f", str(EXAMPLE / "scripts.yaml"))
    for document in trainers_on(IMAGE):
        kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(document))
    kubectl.run("wait", "tfdata/multi-worker", "-n", namespace, "--for=condition=Ready", "--timeout=300s", timeout=310)

    def pods() -> list[dict[str, Any]]:
        return list(kubectl.json("get", "pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={JOB}")["items"])

    def log(pod: dict[str, Any]) -> str:
        return logs(kubectl, namespace, pod["metadata"]["name"])

    def seen() -> str:
        lines = [job_status(kubectl, namespace)]
        for pod in pods():
            where = f"pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}"
            lines.append(f"{where}: {pod['status'].get('phase')}; log tail:\n{log(pod)[-1500:]}")
        lines.append(kubectl.run("get", "tfdata,pods", "-n", namespace, "-o", "wide", check=False).stdout)
        return "\n".join(lines)

    wait_for_job(kubectl, namespace, JOB_TIMEOUT, seen)
    losses = one_model(pods(), log)
    nodes = sorted({pod["spec"]["nodeName"] for pod in pods()})
    print(f"\nmulti-worker example on kind: trainers on {nodes}, losses {losses}")
