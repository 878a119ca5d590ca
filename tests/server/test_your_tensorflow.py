"""Your pipeline, your TensorFlow: the server program injected into an image of the user's (a
TensorFlow 2.16 stand-in, tests/fixtures/servers.py), its preloads, its /serverinfo, and which trainer
TensorFlow reads through which server TensorFlow (the table in docs/your-tensorflow.md)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tfdata_operator.wire import serverconfig, serverinfo
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

from fixtures import servers
from fixtures.servers import Launch, ServerProcess, ServerTensorFlow, free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "your-tensorflow.md"
TABLE_OUT = ROOT / ".local" / "version-table.md"
TABLE_BEGIN, TABLE_END = "<!-- version-table:begin -->", "<!-- version-table:end -->"
POD_NAME = "127.0.0.1"  # "{pod_name}:<port>" then announces a reachable address on this host
TEXT_OP = "TFText>WhitespaceTokenizeWithOffsetsV2"
READ_TIMEOUT = 120.0


@dataclass
class Cluster:
    tensorflow: ServerTensorFlow
    dispatcher: ServerProcess
    worker: ServerProcess

    def info(self, process: ServerProcess) -> serverinfo.ServerInfo:
        return serverinfo.from_json(process.wait_probe(serverinfo.INFO_PATH, 200))

    def logs(self) -> str:
        return "\n".join(f"--- {p.kind} log ---\n{p.log()}" for p in (self.dispatcher, self.worker))


@pytest.fixture(scope="module")
def current() -> ServerTensorFlow:
    return ServerTensorFlow(servers.CURRENT_PYTHON)


@pytest.fixture(scope="module")
def clusters(
    tmp_path_factory: pytest.TempPathFactory, oldest: ServerTensorFlow, current: ServerTensorFlow
) -> Iterator[dict[str, Cluster]]:
    """A dispatcher and a worker on each TensorFlow; those on 2.16 preload tensorflow_text."""
    launches = []
    found = {}
    for name, tensorflow, preload in (("oldest", oldest, ("tensorflow_text",)), ("current", current, ())):
        launches.append(servers.launcher(tmp_path_factory, tensorflow))
        launch: Launch = next(launches[-1])
        dispatcher_port, worker_port = free_port(), free_port()
        dispatcher = launch(
            DispatcherServerConfig(port=dispatcher_port, health_port=free_port(), preload_modules=preload)
        )
        worker = launch(
            WorkerServerConfig(
                port=worker_port,
                health_port=free_port(),
                dispatcher_address=f"127.0.0.1:{dispatcher_port}",
                worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{worker_port}",
                heartbeat_interval_ms=1000,
                # TensorFlow 2.16's WorkerConfig has no data_transfer_port: left out, and logged.
                data_transfer_port=free_port(),
                preload_modules=preload,
            ),
            pod_name=POD_NAME,
        )
        found[name] = Cluster(tensorflow, dispatcher, worker)
    for cluster in found.values():
        for process in (cluster.dispatcher, cluster.worker):
            process.wait_probe("/readyz", 200)
    yield found
    for launched in launches:
        next(launched, None)  # kills what it started


def test_servers_injected_into_tensorflow_2_16_serve_what_they_can_run(
    clusters: dict[str, Cluster], oldest: ServerTensorFlow
) -> None:
    cluster = clusters["oldest"]
    for process in (cluster.dispatcher, cluster.worker):
        info = cluster.info(process)
        assert info.tensorflow_version == "2.16.2"
        assert info.graph_def == oldest.graph_def()
        assert info.preloaded == ("tensorflow_text",)
        assert TEXT_OP in info.preloaded_ops, info.preloaded_ops
        assert set(info.preloaded_ops) <= set(info.ops)
        assert "MapDataset" in info.ops and "MapDataset" not in info.preloaded_ops
        opening = (
            f"TensorFlow 2.16.2 (Python {info.python_version}, GraphDef version {info.graph_def.producer}): "
            f"{len(info.ops)} ops registered, {len(info.preloaded_ops)} by the preloads (tensorflow_text)"
        )
        assert opening in process.log()
    assert "TensorFlow 2.16.2 has no WorkerConfig field data_transfer_port: unused" in cluster.worker.log()


def test_servers_on_the_pinned_tensorflow_serve_their_info_too(
    clusters: dict[str, Cluster], current: ServerTensorFlow
) -> None:
    cluster = clusters["current"]
    for process in (cluster.dispatcher, cluster.worker):
        info = cluster.info(process)
        assert info.graph_def == current.graph_def()
        assert (info.preloaded, info.preloaded_ops) == ((), ())
        assert TEXT_OP not in info.ops
    assert "data_transfer_port: unused" not in cluster.worker.log()


def read(client: ServerTensorFlow, cluster: Cluster, pipeline: str, imports: str = "") -> tuple[list[object], str]:
    """The elements a tf.data client on ``client`` reads through ``cluster``, or why it could not."""
    code = textwrap.dedent(
        f"""
        import json, sys
        import tensorflow as tf
        {imports}
        service = tf.data.experimental.service
        dataset = {pipeline}
        dataset = dataset.apply(service.distribute(
            processing_mode=service.ShardingPolicy.OFF, service="grpc://127.0.0.1:{cluster.dispatcher.config.port}"
        ))
        as_json = lambda e: e.decode() if isinstance(e, bytes) else e.tolist()
        print(json.dumps([as_json(element) for element in dataset.as_numpy_iterator()]))
        """
    )
    try:
        result = subprocess.run(
            [str(client.python), "-c", code], capture_output=True, text=True, timeout=READ_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return [], f"no element within {READ_TIMEOUT:.0f}s"
    if result.returncode != 0:
        return [], result.stderr
    return list(json.loads(result.stdout.strip().splitlines()[-1])), ""


def test_a_pipeline_with_tensorflow_text_ops_reads_through_servers_that_preloaded_it(
    clusters: dict[str, Cluster], oldest: ServerTensorFlow
) -> None:
    cluster = clusters["oldest"]
    elements, error = read(
        oldest,
        cluster,
        "tf.data.Dataset.from_tensor_slices(['a b c', 'tf data service']).map(\n"
        "            lambda s: tf.strings.reduce_join(text.WhitespaceTokenizer().tokenize(s), separator='|'))",
        imports="import tensorflow_text as text",
    )
    assert not error, f"{error[-3000:]}\n{cluster.logs()}"
    assert elements == ["a|b|c", "tf|data|service"]


@pytest.mark.parametrize(
    ("preload", "message"),
    [
        (
            {"preload_modules": ("json", "tensorflow_text")},
            "preload failed: cannot import tensorflow_text: ModuleNotFoundError: No module named 'tensorflow_text'",
        ),
        (
            {"preload_op_libraries": ("/nonexistent/libops.so",)},
            "preload failed: cannot load the op library /nonexistent/libops.so: NotFoundError: ",
        ),
    ],
    ids=["module", "op-library"],
)
def test_a_failed_preload_leaves_the_server_alive_and_unready_saying_why(
    tmp_path_factory: pytest.TempPathFactory, current: ServerTensorFlow, preload: dict[str, object], message: str
) -> None:
    launched = servers.launcher(tmp_path_factory, current)
    launch: Launch = next(launched)
    try:
        dispatcher = launch(DispatcherServerConfig(port=free_port(), health_port=free_port(), **preload))
        body = dispatcher.wait_probe("/readyz", 503, contains="cannot-serve")
        assert body.startswith(f"not ok: cannot-serve: {message}"), body
        time.sleep(3)  # its TensorFlow process has ended: the pod must neither restart nor turn ready
        assert dispatcher.popen.poll() is None, dispatcher.log()
        assert dispatcher.probe("/readyz")[0] == 503
        status, body = dispatcher.probe("/healthz")
        assert status == 200 and body.startswith(f"cannot-serve: {message}"), body
        info = serverinfo.from_json(dispatcher.wait_probe(serverinfo.INFO_PATH, 200))
        assert info.preloaded == (("json",) if "preload_modules" in preload else ())
        errors = [line for line in dispatcher.log().splitlines() if " ERROR " in line]
        assert len(errors) == 1 and f"cannot serve: {message}" in errors[0], dispatcher.log()
        assert dispatcher.terminate(timeout=15) == 0, dispatcher.log()
    finally:
        next(launched, None)


# --- which trainer TensorFlow reads through which server TensorFlow --------------------------------

# A small map/filter/batch pipeline and what it yields.
PIPELINE = "tf.data.Dataset.range(20).map(lambda x: x * 2).filter(lambda x: x % 3 == 0).batch(4)"
EXPECTED = [[0, 6, 12, 18], [24, 30, 36]]


def doc_table() -> str:
    text = DOC.read_text()
    match = re.search(re.escape(TABLE_BEGIN) + r"\n(.*?)" + re.escape(TABLE_END), text, re.S)
    assert match, f"{DOC} has no {TABLE_BEGIN} ... {TABLE_END} block"
    return match[1]


def test_version_table(clusters: dict[str, Cluster]) -> None:
    rows = [
        "| servers' TensorFlow | trainer's TensorFlow | GraphDef versions (servers / trainer) | verdict | read |",
        "|---|---|---|---|---|",
    ]
    wrong = []
    for servers_name in ("oldest", "current"):
        cluster = clusters[servers_name]
        servers_info = cluster.info(cluster.dispatcher)
        for trainer_name in ("oldest", "current"):
            trainer = clusters[trainer_name].tensorflow
            trainer_info = clusters[trainer_name].info(clusters[trainer_name].dispatcher)
            verdict = serverinfo.compatibility(trainer_info.graph_def, servers_info.graph_def)
            elements, error = read(trainer, cluster, PIPELINE)
            worked = not error and elements == EXPECTED
            pair = f"servers {servers_info.tensorflow_version}, trainer {trainer_info.tensorflow_version}"
            if verdict.verdict == serverinfo.REFUSED and worked:
                wrong.append(f"{pair}: refused ({verdict.reason}), but the read worked")
            if verdict.verdict == serverinfo.WORKS and not worked:
                wrong.append(f"{pair}: works, but the read failed: {error[-2000:] or elements}")
            rows.append(
                f"| {servers_info.tensorflow_version} | {trainer_info.tensorflow_version} | "
                f"{servers_info.graph_def.producer} / {trainer_info.graph_def.producer} | {verdict.verdict} | "
                f"{'yes' if worked else 'no'} |"
            )
    table = "\n".join(rows) + "\n"
    TABLE_OUT.parent.mkdir(exist_ok=True)
    TABLE_OUT.write_text(table)
    assert not wrong, "\n".join(wrong)
    assert doc_table() == table, f"{DOC}'s version table differs from what this run saw ({TABLE_OUT}):\n{table}"
