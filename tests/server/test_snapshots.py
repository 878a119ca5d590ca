"""tf.data distributed snapshots through real ``tfdata-server`` processes: ``/v1/snapshots`` and
``client.snapshots`` (save, wait, load).

One fault-tolerant dispatcher with a work_dir (what distributed_save needs) and two workers, the
real server program on 127.0.0.1; the trainer is this test process, with real TensorFlow. The
datasets are small and slowed down a little (``testing.sleep`` on the workers), so a snapshot is
seen in progress and still completes within seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from tfdata_operator.client import snapshots as client_snapshots
from tfdata_operator.wire import discovery, serverconfig, serverinfo, signals, snapshots
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

from fixtures import servers
from fixtures.servers import Launch, ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
POD_NAME = "127.0.0.1"
ELEMENTS = 120
# Per element, on the workers: 120 elements over 2 workers take about a second.
SLEEP_MICROSECONDS = 15_000
WAIT_TIMEOUT = 60.0


@dataclass
class Service:
    dispatcher: ServerProcess
    workers: list[ServerProcess]
    snapshot_dir: Path

    @property
    def environ(self) -> dict[str, str]:
        """The settings the operator publishes for trainers (discovery), with the snapshot directory."""
        health = f"http://127.0.0.1:{self.dispatcher.config.health_port}"
        settings = discovery.ClientSettings(
            address=f"grpc://127.0.0.1:{self.dispatcher.config.port}",
            sharding_policy="DYNAMIC",
            processing_mode="DYNAMIC",
            service_name="snap",
            report_url=health + signals.REPORT_PATH,
            server_info_url=health + serverinfo.INFO_PATH,
            snapshot_dir=str(self.snapshot_dir),
        )
        return discovery.to_data(settings)

    def url(self, query: str = "") -> str:
        return f"http://127.0.0.1:{self.dispatcher.config.health_port}{snapshots.SNAPSHOTS_PATH}" + query

    def report(self, *paths: str) -> snapshots.SnapshotsReport:
        return client_snapshots.read_report(self.url(), paths)

    def path(self, name: str) -> str:
        return str(self.snapshot_dir / name)

    def logs(self) -> str:
        return "\n".join(f"--- {p.kind} ---\n{p.log()[-3000:]}" for p in [self.dispatcher, *self.workers])


@pytest.fixture(scope="module")
def service(module_launch: Launch, tmp_path_factory: pytest.TempPathFactory) -> Service:
    tmp = tmp_path_factory.mktemp("snapshots")
    # The server program imports this package as the test process does (a worktree's PYTHONPATH).
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else None
    port = free_port()
    dispatcher = module_launch(
        DispatcherServerConfig(
            port=port,
            health_port=free_port(),
            work_dir=str(tmp / "journal"),
            fault_tolerant_mode=True,
            snapshot_dir=str(tmp / "data"),  # what render writes from spec.snapshots.directory
        ),
        env=env,
    )
    workers = []
    for _ in range(2):
        worker_port = free_port()
        config = WorkerServerConfig(
            port=worker_port,
            health_port=free_port(),
            dispatcher_address=f"127.0.0.1:{port}",
            worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{worker_port}",
            heartbeat_interval_ms=300,  # a worker takes its stream of a new snapshot on its next heartbeat
        )
        workers.append(module_launch(config, pod_name=POD_NAME, env=env))
    for process in [dispatcher, *workers]:
        process.wait_probe("/readyz", 200)
    (tmp / "data").mkdir()
    return Service(dispatcher, workers, tmp / "data")


def slow_dataset(elements: int = ELEMENTS) -> Any:
    from tensorflow.python.data.experimental.ops import testing

    # (index, a value computed from it): every element is told apart, its value checked.
    dataset = tf.data.Dataset.range(elements).map(lambda x: (x, x * x + 7))
    return dataset.apply(testing.sleep(SLEEP_MICROSECONDS))


def in_process(dataset: Any) -> list[tuple[int, int]]:
    return sorted((int(a), int(b)) for a, b in dataset.as_numpy_iterator())


def test_a_snapshot_reads_in_progress_then_completed_with_the_counts_it_wrote(service: Service) -> None:
    env = service.environ
    path = client_snapshots.save(slow_dataset(), "counted", "snap", environ=env)
    assert path == service.path("counted")
    first = service.report(path).snapshots[0]
    assert first.state == snapshots.IN_PROGRESS, (first, service.logs())
    assert first.journaled and first.started_at is not None, first
    with pytest.raises(client_snapshots.SnapshotNotReadyError, match="is IN_PROGRESS"):
        client_snapshots.load("counted", "snap", environ=env)

    seen: list[snapshots.SnapshotProgress] = []
    done = client_snapshots.wait(
        "counted", "snap", timeout=WAIT_TIMEOUT, progress=seen.append, poll_seconds=0.5, environ=env
    )
    assert seen[0].state == snapshots.IN_PROGRESS and seen[-1] is done, seen
    assert done.state == snapshots.COMPLETED, done
    # Both workers took a stream; every element was committed once.
    assert (done.streams_done, done.streams_total) == (2, 2), done
    assert done.elements == ELEMENTS and done.chunks >= 2, done
    chunk_files = list((service.snapshot_dir / "counted" / "chunks").iterdir())
    assert done.bytes == sum(f.stat().st_size for f in chunk_files) > 0, done
    assert done.finished_at is not None and done.started_at is not None and done.finished_at >= done.started_at
    # Without ?path=, every snapshot the dispatcher journaled.
    listed = service.report()
    assert path in [s.path for s in listed.snapshots] and "journal" in listed.journal, listed


def test_a_completed_snapshot_loads_every_element_once_with_the_values_computed_in_process(service: Service) -> None:
    env = service.environ
    client_snapshots.wait("counted", "snap", timeout=WAIT_TIMEOUT, poll_seconds=0.5, environ=env)
    loaded = in_process(client_snapshots.load("counted", "snap", environ=env))
    assert loaded == in_process(slow_dataset())


def test_saving_again_to_a_path_is_refused_unless_exist_ok(service: Service) -> None:
    env = service.environ
    client_snapshots.wait("counted", "snap", timeout=WAIT_TIMEOUT, poll_seconds=0.5, environ=env)
    with pytest.raises(tf.errors.AlreadyExistsError, match="already started or completed"):
        client_snapshots.save(slow_dataset(), "counted", "snap", environ=env)
    # A trainer that runs again takes the snapshot there as its own, and finds it completed.
    assert client_snapshots.save(slow_dataset(), "counted", "snap", exist_ok=True, environ=env) == service.path(
        "counted"
    )
    assert client_snapshots.progress("counted", "snap", environ=env).state == snapshots.COMPLETED


def test_a_completed_snapshot_loads_through_the_service_each_element_once(service: Service) -> None:
    env = service.environ
    client_snapshots.wait("counted", "snap", timeout=WAIT_TIMEOUT, poll_seconds=0.5, environ=env)
    dataset = client_snapshots.load("counted", "snap", distributed=True, environ=env)
    assert in_process(dataset) == in_process(slow_dataset())


def test_stream_reads_a_snapshot_while_it_is_written(service: Service) -> None:
    env = service.environ
    client_snapshots.save(slow_dataset(), "streamed", "snap", environ=env)
    assert client_snapshots.progress("streamed", "snap", environ=env).state == snapshots.IN_PROGRESS
    read = in_process(client_snapshots.load("streamed", "snap", stream=True, environ=env))
    assert read == in_process(slow_dataset())


def failing_dataset() -> Any:
    def check(x: Any) -> Any:
        tf.debugging.assert_less(x, tf.constant(ELEMENTS // 2, tf.int64), message="element too large")
        return x

    return tf.data.Dataset.range(ELEMENTS).map(check)


def test_a_failed_snapshot_shows_tensorflows_error(service: Service) -> None:
    env = service.environ
    client_snapshots.save(failing_dataset(), "failing", "snap", environ=env)
    with pytest.raises(client_snapshots.SnapshotFailedError, match="element too large") as failed:
        client_snapshots.wait("failing", "snap", timeout=WAIT_TIMEOUT, poll_seconds=0.5, environ=env)
    reading = failed.value.progress
    assert reading.state == snapshots.FAILED and reading.finished_at is not None, reading
    assert reading.error is not None and reading.error.startswith("INVALID_ARGUMENT: "), reading
    with pytest.raises(client_snapshots.SnapshotFailedError, match="element too large"):
        client_snapshots.load("failing", "snap", stream=True, environ=env)


def test_a_path_with_nothing_reads_missing_and_a_bad_query_is_refused(service: Service) -> None:
    missing = service.path("never-saved")
    (reading,) = service.report(missing).snapshots
    assert (reading.state, reading.journaled, reading.elements) == (snapshots.MISSING, False, 0), reading
    with pytest.raises(client_snapshots.SnapshotNotReadyError, match="is MISSING"):
        client_snapshots.load("never-saved", "snap", environ=service.environ)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(service.url("?" + urllib.parse.urlencode({"paths": missing})), timeout=10)
    assert refused.value.code == 400 and "unknown query parameters: paths" in refused.value.read().decode()


def test_saving_on_the_oldest_tensorflow_says_it_cannot() -> None:
    """TensorFlow 2.16 (the oldest the servers run) has no public distributed_save: the helper says so."""
    python = servers.require(servers.OLDEST_PYTHON)
    script = textwrap.dedent(
        """
        import json, sys
        import tensorflow as tf
        from tfdata_operator.client import snapshots
        env = {"TFDATA_SERVICE_ADDRESS": "grpc://127.0.0.1:1", "TFDATA_SHARDING_POLICY": "DYNAMIC",
               "TFDATA_SNAPSHOT_DIR": sys.argv[1]}
        try:
            snapshots.save(tf.data.Dataset.range(3), "x", environ=env)
        except snapshots.SnapshotUnsupportedError as exc:
            print(json.dumps({"version": tf.__version__, "error": str(exc)}))
        """
    )
    result = subprocess.run(
        [str(python), "-c", script, "/tmp/never-written"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "operator" / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"},
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    said = json.loads(lines[-1])
    assert said["version"].startswith("2.16"), said
    assert "has no tf.data.experimental.distributed_save" in said["error"], said
