"""examples/multi-worker/: the pieces of the indexed Job of trainers fit together as applied.

What `kubectl apply -f examples/multi-worker/` creates is checked for the names that tie it together
(the pods' DNS names that TF_CONFIG lists, the service's published ConfigMap and NetworkPolicy label,
the scripts' ConfigMap); the scripts themselves run in tests/server/test_lockstep.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tfdata_operator import cli
from tfdata_operator.api.identity import CLIENT_LABEL

from fixtures.cases import ROOT

EXAMPLE = ROOT / "examples" / "multi-worker"


def applied() -> dict[str, dict[str, Any]]:
    """Every object kubectl would apply from the folder (its .yaml files), by kind."""
    objects = [doc for path in sorted(EXAMPLE.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]
    by_kind = {o["kind"]: o for o in objects}
    assert len(by_kind) == len(objects) == 4, [o["kind"] for o in objects]
    return by_kind


def test_the_scripts_config_map_is_what_the_scripts_are() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "multi-worker-scripts.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_the_service_is_dynamic_and_renders() -> None:
    service = applied()["TFDataService"]
    assert service["spec"]["shardingPolicy"] == "DYNAMIC"
    result = CliRunner().invoke(cli.main, ["render", "-f", str(EXAMPLE / "service.yaml")])
    assert result.exit_code == 0, result.output


def test_the_trainers_find_each_other_and_the_service() -> None:
    objects = applied()
    job, headless, scripts = objects["Job"], objects["Service"], objects["ConfigMap"]
    name = objects["TFDataService"]["metadata"]["name"]
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}

    # N trainers at once, each with its completion index, and TF_CONFIG lists exactly them.
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == int(env["NUM_TRAINERS"]) == 2
    assert env["TF_USE_LEGACY_KERAS"] == "1"
    # Each pod is <job>-<index>.<subdomain>; the headless Service of that name selects the Job's pods.
    assert pod["spec"]["subdomain"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    port = headless["spec"]["ports"][0]["port"]
    assert {"name": "grpc", "containerPort": port} in container["ports"]
    subdomain = pod["spec"]["subdomain"]
    addresses = [env["TRAINER_ADDRESS"].format(index=i) for i in range(2)]
    assert addresses == [f"{job['metadata']['name']}-{i}.{subdomain}:{port}" for i in range(2)]
    # The service's published settings and its NetworkPolicy's admission.
    assert container["envFrom"] == [{"configMapRef": {"name": f"{name}-client"}}]
    assert pod["metadata"]["labels"][CLIENT_LABEL] == name
    # The entry script comes from the scripts' ConfigMap, mounted where the command looks.
    (volume,) = pod["spec"]["volumes"]
    assert volume["configMap"]["name"] == scripts["metadata"]["name"]
    (mount,) = container["volumeMounts"]
    assert mount["name"] == volume["name"]
    assert container["command"][:2] == ["python", f"{mount['mountPath']}/entry.py"]
    assert set(scripts["data"]) == {"entry.py", "train.py"}


@pytest.mark.parametrize("index", [0, 1])
def test_entry_builds_tf_config_from_the_completion_index(index: int) -> None:
    """entry.py, as the pod runs it, up to the moment it starts train.py (here: a script that prints)."""
    env = {"JOB_COMPLETION_INDEX": str(index), "NUM_TRAINERS": "2", "TRAINER_ADDRESS": "t-{index}.h:2222"}
    code = (
        "import os, runpy, sys; os.execv = lambda exe, argv: print(os.environ['TF_CONFIG'], argv[1:]); "
        f"sys.argv = ['entry.py', '--job-name', 'r']; runpy.run_path({str(EXAMPLE / 'entry.py')!r})"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tf_config = '{"cluster": {"worker": ["t-0.h:2222", "t-1.h:2222"]}, "task": {"type": "worker", "index": %d}}'
    assert tf_config % index in done.stdout
    assert f"['{EXAMPLE / 'train.py'}', '--job-name', 'r']" in done.stdout


def test_entry_refuses_an_index_beyond_its_trainers() -> None:
    env = {"JOB_COMPLETION_INDEX": "2", "NUM_TRAINERS": "2", "TRAINER_ADDRESS": "t-{index}.h:2222"}
    done = subprocess.run([sys.executable, str(EXAMPLE / "entry.py")], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "JOB_COMPLETION_INDEX 2 is not a trainer of 2: make NUM_TRAINERS the Job's completions" in done.stderr


def test_the_kind_tiers_trainer_image_has_the_tf_keras_of_the_tests_venv() -> None:
    """images/trainer (the kind tier runs this example's trainers on it) installs the tf-keras that the
    Makefile pins for the tests' venv, which follows the `server` extra's TensorFlow."""
    (pinned,) = re.findall(r"^DEV_NO_DEPS := (tf-keras==\S+)$", (ROOT / "Makefile").read_text(), re.M)
    installed = set(re.findall(r"tf-keras==[0-9.]+", (ROOT / "images" / "trainer" / "Dockerfile").read_text()))
    assert installed == {pinned}, f"images/trainer/Dockerfile installs {installed}, the Makefile pins {pinned}"
