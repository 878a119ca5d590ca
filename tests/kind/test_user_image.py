"""Your pipeline, your TensorFlow: a TFDataService on the image of a user's trainer, on a real kind node.

The image (user-image/Dockerfile) is what a team builds for its trainer as docs/trainers.md
tells it to: a plain Python base, TensorFlow 2.16 (not the server image's), tensorflow-text, and
the trainer package (`pip install ./operator/client-dist`: a `tfdata_operator` in site-packages
with the client helper and no server program). The module builds it and loads it into the
cluster's nodes. The operator injects the server program into the service's pods
(spec.serverProgram: Injected), which must run its own `tfdata_operator` and not the image's
(it would crash with ModuleNotFoundError), and the servers import tensorflow_text before they
start (spec.preload), so a pipeline that tokenizes with tensorflow-text inside a map runs on the
workers. The trainer pod, on the same image, reads with the image's trainer package. Against a
service on the stock server image the same pipeline, from the same pod, is refused by the
helper before any element is read, naming the op, its module and the fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kindpods import readiness, start_pod, tfdata_service, wait_finished, wait_ready

from tfdata_operator.wire import serverconfig

from fixtures.support import ROOT, Kubectl

USER_IMAGE = "tfdata-test/trainer:tf2.16-client"
USER_TENSORFLOW = "2.16.2"  # what user-image/Dockerfile installs
DOCKERFILE = Path(__file__).resolve().parent / "user-image" / "Dockerfile"
USERS, STOCK = "usertf", "stocktf"
OP = "TFText>WhitespaceTokenizeWithOffsetsV2"  # what WhitespaceTokenizer().tokenize runs
COUNT = 300
BUILD_TIMEOUT = 900  # a cold build downloads TensorFlow (214 MB) and installs ~1.3 GB

# The trainer: its own TensorFlow, tensorflow-text and trainer package. It prints where that
# package is and whether it has a server program, the servers' TensorFlow and preloads (what the
# helper checks against), then each element: its number and the count of words tensorflow-text
# found in "0 1 ... i % 7".
TRAINER = """
import importlib.util, json, os, sys, urllib.request
import tfdata_operator
print("package", tfdata_operator.__file__, importlib.util.find_spec("tfdata_operator.server") is not None, flush=True)
import tensorflow as tf
import tensorflow_text as tf_text
from tfdata_operator.client import distribute
from tfdata_operator.wire import serverinfo
with urllib.request.urlopen(os.environ["TFDATA_SERVER_INFO_URL"], timeout=30) as answer:
    info = serverinfo.from_json(answer.read())
print("trainer", tf.__version__, flush=True)
print("servers", json.dumps({"tensorflow": info.tensorflow_version, "preloaded": info.preloaded,
                            "preloaded_ops": info.preloaded_ops}), flush=True)
tokenizer = tf_text.WhitespaceTokenizer()
def words(i):
    text = tf.strings.reduce_join(tf.strings.as_string(tf.range(i % 7 + 1)), separator=" ")
    return i, tf.size(tokenizer.tokenize(text), out_type=tf.int64)
dataset = tf.data.Dataset.range(int(sys.argv[2])).map(words).apply(distribute(sys.argv[1]))
for i, n in dataset:
    print("element", int(i), int(n), flush=True)
print("done", flush=True)
"""


def build_and_load(kubectl: Kubectl) -> str:
    """Builds USER_IMAGE with images/images.sh (its base, BuildKit and pip cache; the repository as
    the context, from which it installs the trainer package) and loads it into
    the kind cluster of ``kubectl``'s kubeconfig; says how long each took and the image's size."""
    context = kubectl.run("config", "current-context").stdout.strip()
    if not context.startswith("kind-"):
        pytest.fail(f"the kubeconfig's context is {context!r}, not a kind cluster's (kind-<name>)")
    env = {**os.environ, "TFDATA_KIND_CLUSTER": context.removeprefix("kind-")}

    def run(*step: str) -> str:
        started = time.monotonic()
        done = subprocess.run(
            step, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT
        )
        assert done.returncode == 0, f"{' '.join(step)} exited with {done.returncode}:\n{done.stderr[-6000:]}"
        return f"{step[0]} {step[1]} {time.monotonic() - started:.0f}s{done.stdout.rstrip()}"

    built = run("images/images.sh", "other", str(DOCKERFILE), USER_IMAGE, str(ROOT))  # ends with the image's size
    loaded = run("kind/cluster.sh", "load", USER_IMAGE)
    return f"{built}\n{loaded}"


@pytest.fixture(scope="module")
def user_image(kubectl: Kubectl) -> str:
    print(f"\n{build_and_load(kubectl)}")
    return USER_IMAGE


def services(image: str) -> list[dict[str, Any]]:
    """The service on the user's image (two DYNAMIC workers, tensorflow_text preloaded), and a
    small one on the stock server image with nothing preloaded."""
    users = tfdata_service(USERS)
    users["spec"].update(image=image, serverProgram="Injected", preload={"modules": ["tensorflow_text"]})
    stock = tfdata_service(STOCK)
    stock["spec"]["dispatcher"] = {}
    stock["spec"]["workers"]["replicas"] = 1
    return [users, stock]


def start_trainer(kubectl: Kubectl, namespace: str, service: str, image: str) -> str:
    """A trainer pod on ``image``, reading with the image's trainer package."""
    name = f"{service}-trainer"
    start_pod(
        kubectl, namespace, name, {"tfdata.dev/client": service}, TRAINER, service, str(COUNT),
        image=image, envFrom=[{"configMapRef": {"name": f"{service}-client"}}],
    )  # fmt: skip
    return name


@pytest.fixture(scope="module")
def trainers(kubectl: Kubectl, namespace: str, user_image: str) -> dict[str, str]:
    """Both services applied at once and Ready, then a trainer pod started against each (they
    run side by side); the trainer pod's name by service."""
    for body in services(user_image):
        body["metadata"]["namespace"] = namespace
        kubectl.apply(body)
    for service in (USERS, STOCK):
        wait_ready(kubectl, namespace, service)
    return {service: start_trainer(kubectl, namespace, service, user_image) for service in (USERS, STOCK)}


def printed(log: str, word: str) -> str | None:
    """What the pod printed after ``word`` on the first line that starts with it."""
    return next((line.split(" ", 1)[1] for line in log.splitlines() if line.startswith(f"{word} ")), None)


def elements(log: str) -> list[tuple[int, int]]:
    return [(int(f[1]), int(f[2])) for f in (line.split() for line in log.splitlines()) if f[0:1] == ["element"]]


def test_the_servers_run_the_users_image_with_the_program_injected(
    kubectl: Kubectl, namespace: str, trainers: dict[str, str]
) -> None:
    for component in ("dispatcher", "worker"):
        pod = kubectl.json("get", "statefulset", f"{USERS}-{component}", "-n", namespace)["spec"]["template"]["spec"]
        (server,) = pod["containers"]
        assert server["image"] == USER_IMAGE, server
        assert server["command"] == ["python3", serverconfig.INJECTED_PROGRAM], server
        injectors = [c["command"] for c in pod.get("initContainers", [])]
        assert injectors == [["python3", "-m", serverconfig.INJECT_MODULE, serverconfig.INJECT_MOUNT]], pod
    ready = readiness(kubectl, namespace, USERS)
    assert ready == {f"{USERS}-dispatcher-0": True, f"{USERS}-worker-0": True, f"{USERS}-worker-1": True}, ready
    # Ready at the first try: the image's own tfdata_operator (the trainer package, no server
    # program) never shadowed the injected one.
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={USERS}")["items"]
    restarts = {p["metadata"]["name"]: [c["restartCount"] for c in p["status"]["containerStatuses"]] for p in pods}
    assert all(counts == [0] for counts in restarts.values()), restarts


def test_a_trainer_on_the_same_image_reads_a_tensorflow_text_pipeline_once(
    kubectl: Kubectl, namespace: str, trainers: dict[str, str]
) -> None:
    phase, log = wait_finished(kubectl, namespace, trainers[USERS], 300)
    assert phase == "Succeeded" and log.rstrip().endswith("done"), log[-4000:]
    # The image's trainer package, as the servers' image has it: no server program.
    assert re.fullmatch(r"/\S+/site-packages/tfdata_operator/__init__\.py False", printed(log, "package") or ""), log
    assert printed(log, "trainer") == USER_TENSORFLOW, log[-4000:]
    servers = json.loads(printed(log, "servers") or "{}")
    assert servers["tensorflow"] == USER_TENSORFLOW and servers["preloaded"] == ["tensorflow_text"], servers
    assert OP in servers["preloaded_ops"], servers
    got = elements(log)
    print(f"\n{len(got)} elements from servers on TensorFlow {servers['tensorflow']} with {servers['preloaded']}")
    assert sorted(got) == [(i, i % 7 + 1) for i in range(COUNT)], (
        f"{len(got)} elements, {len({i for i, _ in got})} distinct; "
        f"missing {sorted(set(range(COUNT)) - {i for i, _ in got})[:20]}; wrong counts "
        f"{[(i, n) for i, n in got if n != i % 7 + 1][:20]}"
    )


def test_the_stock_image_is_refused_before_any_element(
    kubectl: Kubectl, namespace: str, trainers: dict[str, str]
) -> None:
    phase, log = wait_finished(kubectl, namespace, trainers[STOCK], 300)
    refusal = re.search(r"^(?:[\w.]+\.)?MissingOpError: (.*)", log, re.MULTILINE | re.DOTALL)
    assert phase == "Failed" and refusal, log[-4000:]
    print(f"\nstock servers {printed(log, 'servers')}; refused: {refusal[1].strip()}")
    assert not elements(log) and "done" not in log.splitlines(), log[-4000:]
    for words in (OP, "tensorflow_text", "spec.preload.modules", "spec.image"):
        assert words in refusal[1], f"the refusal does not say {words!r}: {refusal[1]}"
