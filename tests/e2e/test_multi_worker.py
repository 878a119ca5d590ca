"""examples/multi-worker/ applied as its README says, on the dev node: two trainer pods of an indexed Job
train one tf-keras model under MultiWorkerMirroredStrategy, reading the DYNAMIC TFDataService
``multi-worker`` in lockstep through the client helper; and the same folder with the service's policy
set to DATA, a static one (each worker repeats its own shard, the rounds take from the workers in turn).

Nothing of the example is changed but the policy: the dev node runs the project's venv instead of the
image (which it ignores), mounts the scripts' ConfigMap at /scripts, gives each pod its completion index
and resolves the pods' names under the headless Service, as a kubelet and cluster DNS would.
tests/server/test_lockstep.py checks the same scripts' batches element by element with the trainers as
processes; tests/kind/test_kind_multi_worker.py runs the folder on kind, on a trainer image. This proves
the folder as a user applies it: the Job completes, both trainers end every epoch with one model, and
the model learned.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fixtures.multiworker import EXAMPLE, job_status, one_model, wait_for_job
from fixtures.support import Kubectl, OperatorProcess

JOB_TIMEOUT = 480.0  # the service Ready, two TensorFlow imports and 3 epochs of 64 steps on a loaded 2-core machine


@pytest.mark.parametrize("policy", ["DYNAMIC", "DATA"])
def test_the_multi_worker_example_trains_one_model_in_two_trainer_pods(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path, policy: str
) -> None:
    service = yaml.safe_load((EXAMPLE / "service.yaml").read_text())
    assert service["spec"]["shardingPolicy"] == "DYNAMIC", service  # the example as written
    service["spec"]["shardingPolicy"] = policy
    kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(service))
    kubectl.run("apply", "-n", namespace, "-f", str(EXAMPLE / "scripts.yaml"), "-f", str(EXAMPLE / "trainers.yaml"))
    uid = kubectl.json("get", "job", "multi-worker-trainer", "-n", namespace)["metadata"]["uid"]

    def pods() -> list[dict]:  # this run's: the other case's Job had the same name
        selector = f"batch.kubernetes.io/controller-uid={uid}"
        return list(kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"])

    def log(pod: dict) -> str:
        path = node_state_dir / "logs" / "pods" / f"{namespace}_{pod['metadata']['name']}" / "trainer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def seen() -> str:
        lines = [job_status(kubectl, namespace)]
        for pod in pods():
            lines.append(f"pod {pod['metadata']['name']}: {pod['status'].get('phase')}; log tail:\n{log(pod)[-1500:]}")
        lines.append(kubectl.run("get", "tfdata,pods", "-n", namespace, "-o", "wide", check=False).stdout)
        return "\n".join(lines)

    wait_for_job(kubectl, namespace, JOB_TIMEOUT, seen)
    one_model(pods(), log)
    shown = kubectl.json("get", "tfdata", "multi-worker", "-n", namespace)["spec"]["shardingPolicy"]
    assert shown == policy, f"the service read under {shown}, not {policy}"
    kubectl.run("delete", "-n", namespace, "-f", str(EXAMPLE), "--wait=true", timeout=180)
