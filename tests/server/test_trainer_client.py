"""The trainer's client helper (``tfdata_operator.client``) against a real dispatcher and workers.

The dispatcher and its workers run in one process (``client_cluster.py``) and every trainer
in a process of its own (``client_trainer.py``), all real TensorFlow on 127.0.0.1: function
names, dataset ids and local workers then behave as between pods.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tfdata_operator.client import servercheck
from tfdata_operator.wire import serverconfig, serverinfo, signals, tfrecords
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

from fixtures import servers
from fixtures.servers import ServerProcess, ServerTensorFlow
from fixtures.support import Pages, free_port

HERE = Path(__file__).resolve().parent
TRAINER_TIMEOUT = 180.0
# `make venv-oldest`: TensorFlow 2.16 with tensorflow_text and nothing of ours, as a user's trainer image.
TEXT_PYTHON = servers.OLDEST_PYTHON


class Cluster:
    def __init__(self, policy: str, workers: int, log: Path) -> None:
        self.policy = policy
        ports = [str(free_port()) for _ in range(workers)]
        self.log = log
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, str(HERE / "client_cluster.py"), policy, str(workers), *ports],
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().decode().strip()  # printed once every worker registered
        if not line.startswith("grpc://"):
            self.stop()
            pytest.fail(f"the {policy} cluster did not start; its log:\n{log.read_text()[-3000:]}")
        self.address = line

    def stop(self) -> None:
        self.popen.kill()
        self.popen.wait(timeout=30)
        self._log.close()


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster("DYNAMIC", 2, tmp_path_factory.mktemp("dynamic") / "cluster.log")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def file_sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster("FILE", 2, tmp_path_factory.mktemp("file") / "cluster.log")
    yield cluster
    cluster.stop()


def start_trainer(
    python: Path = Path(sys.executable), script: str = "client_trainer.py", **args: Any
) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if python != Path(sys.executable):  # the helper as a plain copy on another TensorFlow
        env["PYTHONPATH"] = str(HERE.parents[1] / "operator" / "src")
    return subprocess.Popen(
        [str(python), str(HERE / script), json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def result_of(trainer: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = trainer.communicate(timeout=TRAINER_TIMEOUT)
    except subprocess.TimeoutExpired:
        trainer.kill()
        out, err = trainer.communicate()
        pytest.fail(f"trainer still running after {TRAINER_TIMEOUT:.0f}s; stderr:\n{err[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert trainer.returncode == 0 and lines, f"trainer exited {trainer.returncode}; stderr:\n{err[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_trainer(**args: Any) -> dict[str, Any]:
    return result_of(start_trainer(**args))


def test_fingerprint_is_stable_across_processes_and_changes_with_any_transformation() -> None:
    fresh = start_trainer(pipeline="double", fingerprint_only=True)
    traced = start_trainer(pipeline="double", fingerprint_only=True, trace_first=True)
    other_fn = start_trainer(pipeline="triple", fingerprint_only=True)
    batched = start_trainer(pipeline="double-batched", fingerprint_only=True)
    fresh_r, traced_r, other_r, batched_r = (result_of(t) for t in (fresh, traced, other_fn, batched))
    assert fresh_r["fingerprint"] == traced_r["fingerprint"]
    assert other_r["fingerprint"] != fresh_r["fingerprint"]
    assert batched_r["fingerprint"] != fresh_r["fingerprint"]
    assert fresh_r["chain"] == ["RangeDataset", "ShuffleDatasetV3", "MapDataset(Dataset_map_lambda)"]
    assert batched_r["chain"][-1] == "BatchDatasetV2"


def test_two_identical_trainers_share_a_job_exactly_once(dynamic: Cluster) -> None:
    args = dict(address=dynamic.address, policy="DYNAMIC", pipeline="double", n=300, job_name="shared",
                step_seconds=0.01)  # fmt: skip
    first, second = start_trainer(**args), start_trainer(**args)
    a, b = result_of(first), result_of(second)
    assert "error" not in a and "error" not in b, (a, b)
    together = sorted(a["elements"] + b["elements"])
    assert together == [x * 2 for x in range(300)], "each element exactly once across both trainers"
    assert a["elements"] and b["elements"], "both trainers read from the one job"


def test_a_different_pipeline_on_the_same_job_is_refused(dynamic: Cluster) -> None:
    base = dict(address=dynamic.address, policy="DYNAMIC", n=50, job_name="seed-mismatch")
    first = run_trainer(pipeline="double", **base)
    assert first["elements"] and all(x % 2 == 0 for x in first["elements"])
    refused = run_trainer(pipeline="triple", **base)
    assert refused["error"] == "PipelineMismatchError", refused
    ours = run_trainer(pipeline="triple", n=50, fingerprint_only=True)["fingerprint"][:16]
    theirs = run_trainer(pipeline="double", n=50, fingerprint_only=True)["fingerprint"][:16]
    assert f"fingerprint {theirs}; this trainer's pipeline has fingerprint {ours}" in refused["message"]
    assert "transformation 3 of 3, MapDataset(Dataset_map_lambda)" in refused["message"]
    separate = run_trainer(pipeline="triple", on_mismatch="separate", **base)
    assert sorted(separate["elements"]) == [x * 3 for x in range(50)], "its own job, all of its own elements"


def test_element_spec_mismatch_is_refused_before_training(dynamic: Cluster) -> None:
    base = dict(address=dynamic.address, policy="DYNAMIC", n=20, job_name="spec-mismatch")
    assert "error" not in run_trainer(pipeline="double", **base)
    refused = run_trainer(pipeline="floats", **base)
    assert refused["error"] == "ElementSpecMismatchError", refused
    assert "job 'spec-mismatch' produces int64[]" in refused["message"]
    assert "this trainer's pipeline produces float32[3]" in refused["message"]
    expected = run_trainer(pipeline="double", expect={"shape": [3], "dtype": "float32"}, **base)
    assert expected["error"] == "ElementSpecMismatchError", expected
    assert "produces int64[], but this trainer expects float32[3]" in expected["message"]


def test_wrong_processing_mode_is_refused_with_the_right_advice(file_sharded: Cluster) -> None:
    refused = run_trainer(address=file_sharded.address, policy="FILE", mode="DYNAMIC", pipeline="double", n=10)
    assert refused["error"] == "ProcessingModeError", refused
    assert "Use processing_mode=tf.data.experimental.service.ShardingPolicy.FILE" in refused["message"]


def write_tfrecords(directory: Path, files: int = 4, records: int = 40) -> list[Path]:
    import tensorflow as tf

    paths = []
    for i in range(files):
        path = directory / f"part-{i}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for j in range(records):
                writer.write(f"file {i} record {j} ".encode() * 10)
        paths.append(path)
    return paths


def test_verify_tfrecords_accepts_files_tensorflow_wrote(tmp_path: Path) -> None:
    paths = write_tfrecords(tmp_path)
    summary = tfrecords.verify_files([str(p) for p in paths], jobs=2)
    assert not summary.bad
    assert sum(r.records for r in summary.reports) == 160


@pytest.mark.parametrize("cluster_name", ["dynamic", "file_sharded"])
def test_a_corrupt_tfrecord_is_named_in_the_trainers_error(
    cluster_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """TensorFlow 2.21 gives a bare DataLossError ("truncated record at N") that names the worker, not the file."""
    cluster: Cluster = request.getfixturevalue(cluster_name)
    paths = write_tfrecords(tmp_path)
    data = paths[2].read_bytes()
    paths[2].write_bytes(data[:-30])
    result = run_trainer(
        address=cluster.address, policy=cluster.policy, pipeline="tfrecords", pattern=str(tmp_path / "*.tfrecord")
    )
    assert result["error"] == "CorruptRecordError", result
    assert result["is_data_loss"], "still a tf.errors.DataLossError for code that catches that"
    bad = tfrecords.verify_file(str(paths[2]))
    assert f"{paths[2]}: record {bad.bad_record} at byte {bad.bad_offset}: truncated record" in result["message"]
    assert "ignore_errors" in result["message"]
    assert f"truncated record at {bad.bad_offset}" in result["message"], "TensorFlow's own words are kept"


def measured_server_info() -> serverinfo.ServerInfo:
    """What a server running this process's TensorFlow reports: its versions and every op it registered."""
    import platform

    import tensorflow as tf
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session

    buffer = pywrap_tf_session.TF_GetAllOpList()
    try:
        ops = op_def_pb2.OpList.FromString(pywrap_tf_session.TF_GetBuffer(buffer))
    finally:
        pywrap_tf_session.TF_DeleteBuffer(buffer)
    return serverinfo.ServerInfo(
        tensorflow_version=tf.version.VERSION,
        python_version=platform.python_version(),
        graph_def=servercheck.trainer_versions()[1],
        ops=tuple(sorted(op.name for op in ops.op)),
    )


@pytest.fixture(scope="module")
def served() -> Iterator[Pages]:
    """ServerInfo pages: as measured (/real), lacking Mul (/no-mul), older and too old TensorFlow; 404 elsewhere."""
    real = measured_server_info()
    graph_def = real.graph_def
    assert "Mul" in real.ops and len(real.ops) > 1000, f"measured {len(real.ops)} ops"
    variants = {
        "/real": real,
        "/no-mul": dataclasses.replace(real, ops=tuple(op for op in real.ops if op != "Mul")),
        "/older": dataclasses.replace(real, graph_def=dataclasses.replace(graph_def, producer=graph_def.producer - 1)),
        "/refusing": dataclasses.replace(
            real, graph_def=dataclasses.replace(graph_def, min_producer=graph_def.producer + 1)
        ),
    }
    pages = Pages({path + serverinfo.INFO_PATH: serverinfo.to_json(info) for path, info in variants.items()})
    yield pages
    pages.close()


def test_the_ops_of_a_pipeline_include_those_of_its_functions() -> None:
    import tensorflow as tf

    from tfdata_operator.client.pipeline import graph_def

    dataset = tf.data.Dataset.range(10).map(lambda x: x * 2).filter(lambda x: tf.strings.length(tf.as_string(x)) > 1)
    ops = servercheck.ops_in_graph(graph_def(dataset))
    assert {"RangeDataset", "MapDataset", "FilterDataset", "Mul", "AsString", "StringLength", "Greater"} <= ops
    assert not [op for op in ops if op.startswith("__inference")], "function calls are not ops"


def test_servers_are_checked_before_any_element_is_requested(dynamic: Cluster, served: Pages) -> None:
    base = dict(address=dynamic.address, policy="DYNAMIC", pipeline="double", n=20)
    url = {path: served.url(path + serverinfo.INFO_PATH) for path in ("/real", "/no-mul", "/older", "/refusing")}
    trainers = {
        "real": start_trainer(server_info_url=url["/real"], **base),
        "no-mul": start_trainer(server_info_url=url["/no-mul"], **base),
        "unchecked": start_trainer(server_info_url=url["/no-mul"], check_servers=False, **base),
        "older": start_trainer(server_info_url=url["/older"], **base),
        "refusing": start_trainer(server_info_url=url["/refusing"], **base),
        "gone": start_trainer(server_info_url=served.url("/gone" + serverinfo.INFO_PATH), **base),
    }
    results = {name: result_of(trainer) for name, trainer in trainers.items()}
    everything = sorted(x * 2 for x in range(20))

    real = results["real"]
    assert sorted(real["elements"]) == everything and real["warning_types"] == [], real

    refused = results["no-mul"]
    assert refused["error"] == "MissingOpError", refused
    assert "lack 1 op this pipeline uses: Mul. To fix: for Mul: add what registers it" in refused["message"]
    assert sorted(results["unchecked"]["elements"]) == everything, "check_servers=False sends it anyway"

    older = results["older"]
    assert sorted(older["elements"]) == everything, older
    assert older["warning_types"] == ["TensorFlowVersionWarning"], older
    assert "is newer than the servers'" in older["warnings"][0]

    incompatible = results["refusing"]
    assert incompatible["error"] == "IncompatibleTensorFlowError", incompatible
    assert "the servers' TensorFlow reads graphs of GraphDef version" in incompatible["message"]

    gone = results["gone"]
    assert sorted(gone["elements"]) == everything, gone
    assert gone["warning_types"] == ["ServerCheckSkippedWarning"], gone
    assert "(404: the servers' tfdata-server is older than this helper" in gone["warnings"][0]
    assert served.requests.count("/real" + serverinfo.INFO_PATH) == 1, served.requests


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server program itself: a tfdata-server dispatcher and worker on this TensorFlow, nothing preloaded."""
    launched = servers.launcher(tmp_path_factory, ServerTensorFlow(servers.CURRENT_PYTHON))
    launch = next(launched)
    port, worker_port = free_port(), free_port()
    dispatcher = launch(DispatcherServerConfig(port=port, health_port=free_port()))
    worker = launch(
        WorkerServerConfig(port=worker_port, health_port=free_port(), dispatcher_address=f"127.0.0.1:{port}",
                           worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{worker_port}",
                           heartbeat_interval_ms=1000),
        pod_name="127.0.0.1",
    )  # fmt: skip
    for process in (dispatcher, worker):
        process.wait_probe("/readyz", 200)
    yield dispatcher
    next(launched, None)  # kills what it started


def test_the_server_programs_info_passes_a_pipeline_it_runs_and_refuses_tensorflow_text(
    program: ServerProcess,
) -> None:
    """Servers without tensorflow_text, read from their own /serverinfo; a trainer on TensorFlow 2.16 that has it."""
    if not TEXT_PYTHON.exists():
        pytest.fail(f"no {TEXT_PYTHON}: make venv-oldest")
    base = {
        "address": f"grpc://127.0.0.1:{program.config.port}",
        "policy": "OFF",
        "server_info_url": f"http://127.0.0.1:{program.config.health_port}{serverinfo.INFO_PATH}",
    }
    text = start_trainer(python=TEXT_PYTHON, pipeline="tftext", **base)
    plain = start_trainer(pipeline="double", n=10, **base)
    refused, read = result_of(text), result_of(plain)
    assert refused["error"] == "MissingOpError", refused
    assert (
        "lack 1 op this pipeline uses: TFText>WhitespaceTokenizeWithOffsetsV2 (registered by tensorflow_text)"
        in (refused["message"])
    )
    assert "add tensorflow_text to spec.preload.modules of the TFDataService at grpc://" in refused["message"]
    assert sorted(read["elements"]) == [x * 2 for x in range(10)] and read["warning_types"] == [], read


def read_signals(program: ServerProcess) -> signals.ServiceSignals:
    url = f"http://127.0.0.1:{program.config.health_port}{signals.SIGNALS_PATH}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return signals.ServiceSignals.from_json(response.read())


def start_fit(program: ServerProcess, slow: str, report_url: str | None = None, **more: Any) -> subprocess.Popen[str]:
    health = f"http://127.0.0.1:{program.config.health_port}"
    return start_trainer(
        script="fit_trainer.py", address=f"grpc://127.0.0.1:{program.config.port}", policy="OFF",
        server_info_url=health + serverinfo.INFO_PATH, report_url=report_url or health + signals.REPORT_PATH,
        slow=slow, **more,
    )  # fmt: skip


def fit_and_sample(program: ServerProcess, slow: str) -> tuple[dict[str, Any], list[signals.ServiceSignals]]:
    """A Keras trainer's ``model.fit`` through the server program, with the dispatcher's signals read every 0.25 s."""
    trainer = start_fit(program, slow)
    samples: list[signals.ServiceSignals] = []

    def sample() -> None:
        while trainer.poll() is None:
            samples.append(read_signals(program))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = result_of(trainer)
    sampler.join(10)
    return result, samples


def test_a_keras_fit_reports_its_data_stall_with_one_callback(program: ServerProcess) -> None:
    """``model.fit(dataset, callbacks=[StallCallback()])`` on a ``distribute()`` dataset: the dispatcher counts it
    as a reporting client while it fits, with a stall near 1 when the workers are slow and near 0 when the step
    is, and forgets it at once when the fit ends (``done``)."""
    seen: dict[str, list[float]] = {}
    for slow in ("data", "step"):  # one after the other: the dispatcher's figures are over all its clients
        result, samples = fit_and_sample(program, slow)
        reporting = [s for s in samples if s.reporting_clients >= 1]
        assert reporting, f"slow {slow}: no signal showed a reporting client during the fit: {samples[-3:]}"
        assert all(s.reporting_clients == 1 for s in reporting), [s.reporting_clients for s in samples]
        assert result["elements"] >= 300, result  # one element per step, each timed by distribute()'s stage
        # The callback sends done before fit returns, and the trainer prints after that.
        assert read_signals(program).reporting_clients == 0, "done was sent at the end of fit"
        seen[slow] = [s.client_stall_fraction_mean or 0.0 for s in reporting]
        print(
            f"\nslow {slow}: {len(reporting)} of {len(samples)} signals with a reporting client, stall "
            f"{statistics.median(seen[slow]):.2f} (median; {min(seen[slow]):.2f}..{max(seen[slow]):.2f}), "
            f"measured in the trainer {result['stall_fraction']:.2f}, {result['steps_per_second']:.0f} steps/s"
        )
    slow_data, slow_step = statistics.median(seen["data"]), statistics.median(seen["step"])
    assert slow_data >= 0.8, f"workers 30 ms a batch, a step of under 1 ms: the fit waits, yet reported {slow_data}"
    assert slow_step <= 0.2, f"a step of 30 ms, the data at hand: the fit hardly waits, yet reported {slow_step}"


def test_a_keras_fit_trains_on_when_the_dispatcher_pod_does_not_answer(program: ServerProcess) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}{signals.REPORT_PATH}"  # nothing listens there
    trainer = start_fit(program, "none", report_url=unreachable)
    result = result_of(trainer)
    assert result["elements"] >= 300, result
    said = [line for line in result["logged"] if "cannot send the data-stall report" in line]
    assert len(said) == 1, result["logged"]


@pytest.mark.parametrize("python", [servers.CURRENT_PYTHON, servers.OLDEST_PYTHON], ids=["current", "tf2.16"])
def test_two_keras_fits_in_a_row_each_report_their_own_elements(program: ServerProcess, python: Path) -> None:
    """The stage's counters live as long as the process: a second fit's callback counts from where they were
    when it began, not the first fit's elements too. On this TensorFlow and on the oldest supported (2.16)."""
    if not python.exists():
        pytest.fail(f"no {python}: make venv-oldest")
    result = result_of(start_fit(program, "data", python=python, fits=[120, 40]))
    first, second = result["fits"]
    print(f"\ntwo fits in a row on {python}: {first}, {second}")
    assert 120 <= first["elements"] < 160 and 40 <= second["elements"] < 80, result["fits"]
    # Workers 30 ms a batch, a step of under 1 ms: each fit waited about 30 ms for each of its own elements (the
    # second's with the first's would be 4x its own). Its fraction also counts the fit's start, slow when loaded.
    for fit in (first, second):
        assert 0.5 <= fit["waited"] / (0.03 * fit["elements"]) <= 1.5, result["fits"]
