"""Trainers in pods on the dev node, reading through the client helper (``tfdata_operator.client``).

Every trainer here is a Pod with the label ``tfdata.dev/client: <service>`` and ``envFrom`` the
``<service>-client`` ConfigMap the operator publishes; its command names the service, never its
address or mode, so the settings it reads come from that environment alone (the dev node gives a
container nothing of the host's environment). The trainer is tests/e2e/clients/read_dataset.py
with ``--discover``, or examples/trainer.py run by the example Job. Two services, one DYNAMIC and
one FILE, serve every case; each case uses a job name of its own. The Keras case
(tests/e2e/clients/fit_dataset.py, two trainer pods) has an autoscaled service of its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tfdata_operator.wire import tfrecords

from fixtures.manifests import API_VERSION
from fixtures.support import ROOT, Kubectl, OperatorProcess, WorkerCounts, stalled_on_idle_workers_said, wait_for

CLIENTS = Path(__file__).resolve().parent / "clients"
FILES, RECORDS = 4, 30
ALL = [f"f{f}-r{r}" for f in range(FILES) for r in range(RECORDS)]
DYNAMIC, FILE = "tr-dynamic", "tr-file"
POD_TIMEOUT = 240.0  # a trainer's whole run, TensorFlow's import on a loaded 2-core machine included


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``good``: FILES TFRecord files; ``corrupt``: the same with file 2's last record cut short.
    Under the repository, not /tmp, so the server pods can read them."""
    directory = ROOT / ".local" / f"e2e-trainer-data-{tmp_path_factory.getbasetemp().name}"
    subprocess.run(
        [sys.executable, str(CLIENTS / "make_dataset.py"), str(directory / "good"), f"--files={FILES}",
         f"--records={RECORDS}"],
        check=True, capture_output=True,
    )  # fmt: skip
    shutil.copytree(directory / "good", directory / "corrupt")
    cut = directory / "corrupt" / "part-002.tfrecord"
    cut.write_bytes(cut.read_bytes()[:-5])
    (directory / "barriers").mkdir()
    yield directory
    subprocess.run(["rm", "-rf", str(directory)], check=False)


@dataclass
class Run:
    """What a trainer pod printed (tests/e2e/clients/read_dataset.py's lines) and how it ended."""

    name: str
    phase: str
    log: str
    elements: list[str] = field(default_factory=list)
    lines: dict[str, str] = field(default_factory=dict)  # the last "settings", "fingerprint", "error", ...

    @classmethod
    def parse(cls, name: str, phase: str, log: str) -> Run:
        run = cls(name, phase, log)
        for line in log.splitlines():
            kind, _, value = line.partition(" ")
            if kind == "element":
                run.elements.append(value)
            elif kind in ("settings", "fingerprint", "error", "summary", "ready"):
                run.lines[kind] = value
        return run

    @property
    def error(self) -> str:
        return self.lines.get("error", "")

    def describe(self) -> str:
        return f"pod {self.name}: {self.phase}, {len(self.elements)} elements; log tail:\n{self.log[-3000:]}"


class Trainers:
    """Trainer pods in the test namespace, and what they printed."""

    def __init__(self, kubectl: Kubectl, namespace: str, state_dir: Path, data: Path) -> None:
        self.kubectl, self.ns, self.state_dir, self.data = kubectl, namespace, state_dir, data

    def start(self, name: str, service: str, *args: str, files: str = "good") -> str:
        """A trainer pod for ``service``: the settings come from envFrom, the arguments say what to read."""
        pattern = str(self.data / files / "*.tfrecord")
        command = ["python", str(CLIENTS / "read_dataset.py"), "--discover", service, "--files", pattern,
                   f"--timeout={POD_TIMEOUT - 20:.0f}", *args]  # fmt: skip
        return self.start_pod(name, service, command)

    def start_pod(self, name: str, service: str, command: list[str], env: dict[str, str] | None = None) -> str:
        """A pod that runs ``command`` with ``envFrom`` the ``service``'s ConfigMap (and ``env``)."""
        self.kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.ns, "labels": {"tfdata.dev/client": service}},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "my-trainer:latest",  # the dev node runs the project's venv instead
                            "command": command,
                            "envFrom": [{"configMapRef": {"name": f"{service}-client"}}],
                            "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                        }
                    ],
                },
            }
        )
        return name

    def log(self, name: str, container: str = "trainer") -> str:
        path = self.state_dir / "logs" / "pods" / f"{self.ns}_{name}" / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def phase(self, name: str) -> str:
        return str(self.kubectl.json("get", "pod", name, "-n", self.ns).get("status", {}).get("phase"))

    def wait_line(self, name: str, kind: str) -> None:
        """Waits until the pod printed a line starting with ``kind`` (e.g. "ready")."""
        wait_for(
            lambda: (
                any(line.split(" ", 1)[0] == kind for line in self.log(name).splitlines())
                or self.phase(name) in ("Succeeded", "Failed")
            ),
            POD_TIMEOUT,
            f"pod {name} to print {kind!r}",
            show=lambda: f"phase {self.phase(name)}; log tail:\n{self.log(name)[-2000:]}",
        )
        assert self.phase(name) not in ("Succeeded", "Failed"), f"{name} ended early:\n{self.log(name)[-2000:]}"

    def finish(self, name: str) -> Run:
        phase = wait_for(
            lambda: self.phase(name),
            POD_TIMEOUT,
            f"trainer pod {name} to end",
            until=lambda p: p in ("Succeeded", "Failed"),
            show=lambda: f"phase {self.phase(name)}; log tail:\n{self.log(name)[-2000:]}",
        )
        return Run.parse(name, phase, self.log(name))

    def configmap(self, service: str) -> dict[str, str]:
        return dict(self.kubectl.json("get", "configmap", f"{service}-client", "-n", self.ns)["data"])

    def address(self, service: str) -> str:
        return str(self.kubectl.json("get", "tfdata", service, "-n", self.ns)["status"]["dispatcherAddress"])


@pytest.fixture(scope="module")
def trainers(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path, data: Path
) -> Iterator[Trainers]:
    """The module's two services, Ready (created together, so they start side by side)."""
    for name, policy in ((DYNAMIC, "DYNAMIC"), (FILE, "FILE")):
        kubectl.apply(
            {
                "apiVersion": API_VERSION,
                "kind": "TFDataService",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"shardingPolicy": policy, "workers": {"replicas": 2}},
            }
        )
    for name in (DYNAMIC, FILE):
        waited = kubectl.run(
            "wait", "--for=condition=Ready", f"tfdata/{name}", "-n", namespace, "--timeout=300s",
            check=False, timeout=310,
        )  # fmt: skip
        seen = kubectl.run("get", "tfdata,pods", "-n", namespace, "-o", "wide", check=False).stdout
        assert waited.returncode == 0, f"{name} not Ready: {waited.stderr}\n{seen}"
    yield Trainers(kubectl, namespace, node_state_dir, data)


def test_identical_trainers_share_one_job_exactly_once_with_settings_from_envfrom(trainers: Trainers) -> None:
    barrier = trainers.data / "barriers" / "shared"
    pods = [trainers.start(f"same-{i}", DYNAMIC, "--job-name=shared", f"--start-when={barrier}", "--delay=0.05")
            for i in range(2)]  # fmt: skip
    for pod in pods:  # both joined the job before either reads, so both get a share
        trainers.wait_line(pod, "ready")
    barrier.touch()
    runs = [trainers.finish(pod) for pod in pods]
    for run in runs:
        assert run.phase == "Succeeded" and "summary" in run.lines, run.describe()
        given = json.loads(run.lines["settings"])
        assert given == trainers.configmap(DYNAMIC), f"{run.name} got other settings than the ConfigMap's: {given}"
        assert given["TFDATA_SERVICE_ADDRESS"] == trainers.address(DYNAMIC)
        assert given["TFDATA_PROCESSING_MODE"] == "DYNAMIC"
        assert run.elements, f"both trainers read from the one job: {run.describe()}"
    together = Counter(runs[0].elements + runs[1].elements)
    assert together == Counter(ALL), (
        f"each record exactly once across both trainers; repeated {[e for e, n in together.items() if n > 1][:10]}, "
        f"missing {sorted(set(ALL) - set(together))[:10]}"
    )


def test_trainers_whose_pipelines_differ_are_refused_the_job(trainers: Trainers) -> None:
    """The seed's case: the same job_name, a different map function, where TensorFlow alone gives the
    second trainer the first one's elements without a word; and one whose elements differ in type."""
    first = trainers.start("seed-upper", DYNAMIC, "--job-name=seed", "--map=upper", "--delay=0.02")
    trainers.wait_line(first, "ready")  # it holds the job
    other_map = trainers.start("seed-suffix", DYNAMIC, "--job-name=seed", "--map=suffix")
    other_type = trainers.start("seed-length", DYNAMIC, "--job-name=seed", "--map=length")
    held, refused, wrong_type = (trainers.finish(p) for p in (first, other_map, other_type))

    assert held.phase == "Succeeded", held.describe()
    assert Counter(held.elements) == Counter(e.upper() for e in ALL), held.describe()

    assert refused.phase == "Failed" and not refused.elements, refused.describe()
    assert refused.error.startswith("PipelineMismatchError: job 'seed' was started by a trainer"), refused.describe()
    ours, theirs = refused.lines["fingerprint"][:16], held.lines["fingerprint"][:16]
    assert ours != theirs
    assert f"fingerprint {theirs}; this trainer's pipeline has fingerprint {ours}" in refused.error, refused.error
    assert "MapDataset" in refused.error, f"the differing transformation is named: {refused.error}"

    assert wrong_type.phase == "Failed" and not wrong_type.elements, wrong_type.describe()
    assert wrong_type.error.startswith("ElementSpecMismatchError: job 'seed' produces string[]"), wrong_type.error
    assert "this trainer's pipeline produces int32[]" in wrong_type.error, wrong_type.error


def test_a_wrong_processing_mode_is_refused_with_the_right_advice(trainers: Trainers) -> None:
    run = trainers.finish(trainers.start("mode", FILE, "--mode=DYNAMIC", "--job-name=mode"))
    assert run.phase == "Failed" and not run.elements, run.describe()
    assert run.error.startswith(f"ProcessingModeError: service '{FILE}' shards with FILE"), run.error
    assert "Use processing_mode=tf.data.experimental.service.ShardingPolicy.FILE" in run.error, run.error


def test_a_corrupt_tfrecord_is_named_in_the_trainers_error(trainers: Trainers) -> None:
    """Under DYNAMIC and FILE, TensorFlow alone says only "truncated record at N" and the worker."""
    bad = tfrecords.verify_file(str(trainers.data / "corrupt" / "part-002.tfrecord"))
    assert bad.bad_record is not None, bad
    pods = [trainers.start(f"corrupt-{s}", s, "--job-name=corrupt", files="corrupt") for s in (DYNAMIC, FILE)]
    for run in [trainers.finish(pod) for pod in pods]:
        assert run.phase == "Failed", run.describe()
        assert run.error.startswith("CorruptRecordError: "), run.error
        assert "a tf.data worker read a corrupt TFRecord file" in run.error, run.error
        assert bad.describe() in run.error, f"{run.name}: the file, record and offset named: {run.error}"
        assert f"truncated record at {bad.bad_offset}" in run.error, "TensorFlow's own words are kept"
        assert "ignore_errors" in run.error, run.error


def test_the_example_trainer_job_shares_one_pass(trainers: Trainers) -> None:
    """examples/trainer-job/job.yaml running examples/trainer.py, as a user would apply them, with what
    the dev node cannot have replaced: the image (the project's venv runs examples/trainer.py), the
    service's name, and the data claim (the workers read the same files)."""
    job = yaml.safe_load((ROOT / "examples" / "trainer-job" / "job.yaml").read_text())
    text = (
        json.dumps(job).replace("imagenet", DYNAMIC).replace("/app/trainer.py", str(ROOT / "examples" / "trainer.py"))
    )
    job = json.loads(text.replace("/data/train-*.tfrecord", str(trainers.data / "good" / "*.tfrecord")))
    job["metadata"]["namespace"] = trainers.ns
    pod_spec = job["spec"]["template"]["spec"]
    del pod_spec["volumes"], pod_spec["containers"][0]["volumeMounts"]
    trainers.kubectl.apply(job)
    name = job["metadata"]["name"]

    def pods() -> list[dict[str, Any]]:
        listed = trainers.kubectl.json("get", "pods", "-n", trainers.ns, "-l", f"job-name={name}")["items"]
        return list(listed)

    def logs() -> str:
        return "\n".join(f"--- {p['metadata']['name']}\n{trainers.log(p['metadata']['name'])[-1500:]}" for p in pods())

    status = wait_for(
        lambda: trainers.kubectl.json("get", "job", name, "-n", trainers.ns).get("status", {}),
        POD_TIMEOUT,
        f"Job {name} to complete",
        until=lambda s: s.get("succeeded", 0) == 2 or s.get("failed", 0) > 0,
        show=logs,
    )
    assert status.get("succeeded") == 2, f"{status}\n{logs()}"
    done = [
        line for p in pods() for line in trainers.log(p["metadata"]["name"]).splitlines() if line.startswith("done:")
    ]
    assert len(done) == 2, logs()
    # Two trainers, one tf.data job: one pass between them (two separate jobs would read it twice).
    assert sum(int(line.split()[1]) for line in done) == len(ALL), logs()


def test_two_keras_fits_with_stall_callback_are_autoscaled_on_an_io_bound_service(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path
) -> None:
    """Issues 24 and 40: ``model.fit(dataset, callbacks=[StallCallback()])`` in two trainer pods that share
    one job (``job_name="fit"``), on a DYNAMIC service whose pipeline waits 100 ms a batch in the workers
    and costs them almost no CPU (a read from a bucket). The dispatcher counts both trainers, the
    service's status lists their job with 2 trainers (and 2 clients by the dispatcher's journal), and
    the TFData autoscaler, seeing them wait on an idle worker, adds the second worker as it does for one
    trainer. A trainer whose pod is deleted (no final report) stops counting while the other still
    reads. The pods run this checkout's client helper."""
    name = "tr-keras"
    # Under the repository: the pods see them.
    stops = [ROOT / ".local" / f"e2e-keras-stop-{namespace}-{i}" for i in (0, 1)]
    for stop in stops:
        stop.unlink(missing_ok=True)
    autoscaling = {"metric": "TFData", "minReplicas": 1, "maxReplicas": 2}
    kubectl.apply(
        {
            "apiVersion": API_VERSION,
            "kind": "TFDataService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 1}, "autoscaling": autoscaling},
        }
    )
    waited = kubectl.run("wait", "--for=condition=Ready", f"tfdata/{name}", "-n", namespace, "--timeout=120s",
                         check=False, timeout=130)  # fmt: skip
    assert waited.returncode == 0, f"{name} not Ready: {waited.stderr}"
    pods = Trainers(kubectl, namespace, node_state_dir, ROOT / ".local")
    fits = [
        pods.start_pod(
            f"keras-fit-{i}", name,
            ["python", str(CLIENTS / "fit_dataset.py"), name, f"--stop-file={stop}", "--sleep-ms=100", "--timeout=180",
             "--job-name=fit"],
            # The venv's editable install may point at another checkout than this one: run this one's helper.
            env={"PYTHONPATH": str(ROOT / "operator" / "src")},
        )
        for i, stop in enumerate(stops)
    ]  # fmt: skip
    started = time.monotonic()
    seen: list[dict[str, Any]] = []

    def signals() -> dict[str, Any]:
        got = dict(kubectl.json("get", "tfdata", name, "-n", namespace).get("status", {}).get("autoscaling", {}))
        seen.append(got.get("signals", {}))
        return got

    def reporting() -> int:
        return int(signals().get("signals", {}).get("reportingClients") or 0)

    def events() -> str:
        return str(kubectl.run("describe", "tfdata", name, "-n", namespace).stdout)

    def logs() -> str:
        return "\n".join(f"{pod}:\n{pods.log(pod)[-1500:]}" for pod in fits)

    # The worker StatefulSet's own count, not the operator's account of it (tests review N7).
    counts = WorkerCounts(kubectl, namespace, name)
    try:
        with counts:
            wait_for(reporting, 180, "both fits to count as reporting clients", interval=1, until=lambda n: n >= 2,
                     show=lambda: f"{seen[-3:]}\n{logs()}")  # fmt: skip
            both = time.monotonic() - started
            during = seen[-1]
            # The signals are sampled until the Event, to show what the autoscaler saw with one worker.
            wait_for(lambda: (signals(), "Scaled workers from 1 to 2" in events())[1], 120,
                     "the autoscaler to scale 1 -> 2", interval=2,
                     show=lambda: f"{signals()}\n{events()[-1500:]}\n{logs()}")  # fmt: skip
            scaled = time.monotonic() - started
            with_one = [s for s in seen if s.get("workersAnswering") == 1]
            wait_for(counts.most_ready, 120, "the worker StatefulSet's readyReplicas to reach 2", interval=2,
                     until=lambda ready: ready >= 2, show=lambda: counts.seen[-5:])  # fmt: skip
            assert [pods.phase(pod) for pod in fits] == ["Running"] * 2, f"a fit ended before the scale:\n{logs()}"
            # A trainer that goes without a final report (its pod deleted) stops counting once its reports
            # are older than client_report_timeout_ms (15 s); the other one still counts.
            kubectl.run("delete", "pod", fits[0], "-n", namespace, "--wait=true", "--timeout=60s", timeout=70)
            gone = time.monotonic()
            wait_for(reporting, 60, "the deleted trainer to stop counting", interval=1, until=lambda n: n == 1,
                     show=lambda: f"{seen[-3:]}\n{logs()}")  # fmt: skip
            forgotten = time.monotonic() - gone
            assert pods.phase(fits[1]) == "Running", f"the other fit ended:\n{logs()}"
    finally:
        for stop in stops:
            stop.touch()
    # Below target before: one worker ready (spec 1) at first, and with it the trainers stalled on data
    # while the worker's CPU was far below the target (an I/O-bound pipeline), as test_tfdata's I/O case checks.
    assert counts.seen and counts.seen[0][1:] == (1, 1), f"(time, ready, replicas) seen: {counts.seen}"
    target = kubectl.json("get", "tfdata", name, "-n", namespace)["spec"]["autoscaling"]
    target_cpu = int(target["targetCPUUtilizationPercentage"])  # the CRD's default
    two = [s for s in with_one if s.get("reportingClients") == 2]
    assert any(stalled_on_idle_workers_said(s, target_cpu) for s in two), (
        f"no sample with one worker shows both trainers stalled on an idle worker (target {target_cpu}%): {with_one}"
    )
    # One job, read by both: the status lists it with its two trainers, both also reading it by the
    # dispatcher's journal (clients).
    jobs = [s.get("jobs") for s in two if s.get("jobs")]
    assert any(j == [{**j[0], "name": "fit", "trainers": 2, "clients": 2}] for j in jobs), (
        f"the shared job with 2 trainers: {jobs}"
    )
    run = pods.finish(fits[1])
    summary = next((line for line in run.log.splitlines() if line.startswith("summary ")), "")
    assert run.phase == "Succeeded" and summary, run.describe()
    result = json.loads(summary.split(" ", 1)[1])
    assert result["helper"].startswith(str(ROOT)), f"the pod ran another checkout's helper: {result}"
    print(
        f"\n{name}: 2 reportingClients {both:.0f}s after the pods were created (dataStallPercent "
        f"{during.get('dataStallPercent')}, workerCPUPercent {during.get('workerCPUPercent')}, "
        f"jobs {during.get('jobs')}); "
        f"scaled 1 -> 2 at {scaled:.0f}s; the deleted trainer stopped counting {forgotten:.1f}s after its pod "
        f"was gone; the other trainer: {result}"
    )
    text = events()
    print(text[text.index("Events:") :])
    for stop in stops:
        stop.unlink(missing_ok=True)
    kubectl.run("delete", "tfdata", name, "-n", namespace, "--wait=false", check=False)
