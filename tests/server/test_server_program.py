"""``tfdata-server`` as real processes with real TensorFlow on 127.0.0.1: probes, sharding, signals, errors.

Ports come from the kernel (bind to 0); every wait has a timeout and, when it gives up,
says what it saw and shows the server's log.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tfdata_operator.wire import serverconfig, serverinfo
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

from fixtures.servers import START_TIMEOUT, Launch, ServerProcess, ServerTensorFlow, free_port, wait_for, worker_config

# The worker's pod name; "{pod_name}:<port>" then announces a reachable address on this host.
POD_NAME = "127.0.0.1"
ELEMENTS = 50


Probes = dict[str, tuple[int | None, str]]


@dataclass
class StaticCluster:
    dispatcher: ServerProcess
    workers: list[ServerProcess]
    early_probes: list[Probes]  # each worker's probes while no dispatcher existed


@pytest.fixture(scope="module")
def static_cluster(module_launch: Launch) -> Iterator[StaticCluster]:
    """A dispatcher with a static list of two workers, the workers started first."""
    dispatcher_port = free_port()
    worker_configs = [worker_config(dispatcher_port) for _ in range(2)]
    workers = [module_launch(config, pod_name=POD_NAME) for config in worker_configs]
    early = []
    for worker in workers:
        # Blocked in TensorFlow's start(), waiting for a dispatcher that does not exist yet.
        worker.wait_probe("/readyz", 503, contains="registering with dispatcher")
        early.append({path: worker.probe(path) for path in ("/healthz", "/readyz")})
    dispatcher = module_launch(
        DispatcherServerConfig(
            port=dispatcher_port,
            health_port=free_port(),
            worker_addresses=tuple(c.worker_address(POD_NAME) for c in worker_configs),
        )
    )
    for process in [dispatcher, *workers]:
        process.wait_probe("/readyz", 200)
    yield StaticCluster(dispatcher, workers, early)


def test_worker_is_alive_but_not_ready_until_the_dispatcher_accepts_it(static_cluster: StaticCluster) -> None:
    for early, worker in zip(static_cluster.early_probes, static_cluster.workers, strict=True):
        assert early["/healthz"][0] == 200, early
        status, body = early["/readyz"]
        assert status == 503, early
        # The announced address is made from POD_NAME, never localhost.
        assert f"registering with dispatcher at 127.0.0.1:{static_cluster.dispatcher.config.port}" in body
        assert f"as 127.0.0.1:{worker.config.port}" in body
        status, body = worker.probe("/readyz")
        assert status == 200, body
        assert f"registered with dispatcher at 127.0.0.1:{static_cluster.dispatcher.config.port}" in body


def test_servers_run_on_the_tensorflow_chosen_and_say_so(
    static_cluster: StaticCluster, server_tf: ServerTensorFlow
) -> None:
    # `make test-server-oldest` must really run them on TensorFlow 2.16, injected.
    graph_def = server_tf.graph_def()
    for process in [static_cluster.dispatcher, *static_cluster.workers]:
        info = serverinfo.from_json(process.wait_probe(serverinfo.INFO_PATH, 200))
        assert info.graph_def == graph_def, (info, server_tf)
        assert f"TensorFlow {info.tensorflow_version} (Python {info.python_version}" in process.log()


def test_dispatcher_counts_its_static_workers(static_cluster: StaticCluster) -> None:
    body = static_cluster.dispatcher.wait_probe("/readyz", 200, contains="2 of 2 workers registered", timeout=15)
    assert "dispatcher serving" in body
    assert "2 static workers" in static_cluster.dispatcher.log()


def test_data_sharding_reads_each_element_exactly_once(
    static_cluster: StaticCluster, server_tf: ServerTensorFlow
) -> None:
    client = textwrap.dedent(
        f"""
        import json
        import tensorflow as tf
        service = tf.data.experimental.service
        dataset = tf.data.Dataset.range({ELEMENTS}).apply(service.distribute(
            processing_mode=service.ShardingPolicy.DATA,
            service="grpc://127.0.0.1:{static_cluster.dispatcher.config.port}",
        ))
        print(json.dumps([int(x) for x in dataset.as_numpy_iterator()]))
        """
    )
    try:
        result = subprocess.run([str(server_tf.python), "-c", client], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the tf.data client did not finish in 90s; stderr: {exc.stderr!r}\n{_logs(static_cluster)}")
    assert result.returncode == 0, f"{result.stderr[-3000:]}\n{_logs(static_cluster)}"
    elements = json.loads(result.stdout.strip().splitlines()[-1])
    # Under DATA sharding worker i produces only the elements i (mod 2): every element
    # exactly once means each worker served its own shard, once.
    assert sorted(elements) == list(range(ELEMENTS)), elements


def test_worker_missing_from_the_static_list_exits_1_with_tensorflow_message(
    static_cluster: StaticCluster, launch: Launch
) -> None:
    stranger = launch(worker_config(static_cluster.dispatcher.config.port), pod_name=POD_NAME)
    code = stranger.wait_exit(60)
    log = stranger.log()
    assert code == 1, log
    address = f"127.0.0.1:{stranger.config.port}"
    assert (
        f"worker failed to start: Failed to perform worker heartbeat: Failed to assign an index for worker {address}"
        in log
    )
    # The cluster is unaffected.
    assert static_cluster.dispatcher.probe("/readyz")[0] == 200


def test_sigterm_stops_dispatcher_and_workers_with_exit_0(static_cluster: StaticCluster) -> None:
    for process in [*static_cluster.workers, static_cluster.dispatcher]:
        code = process.terminate(timeout=30)
        log = process.log()
        assert code == 0, log
        assert "received SIGTERM" in log
        assert f"{process.kind} stopped" in log  # TensorFlow's server.stop() ran


def test_fault_tolerant_dispatcher_ready_only_once_started_and_stops_on_sigterm(launch: Launch, tmp_path: Path) -> None:
    work_dir = tmp_path / "dispatcher"
    config = DispatcherServerConfig(
        port=free_port(), health_port=free_port(), work_dir=str(work_dir), fault_tolerant_mode=True
    )
    dispatcher = launch(config, via_file=True)
    first = dispatcher.wait_probe("/readyz", 503, timeout=30)  # answered before TensorFlow is even imported
    assert "starting" in first
    assert dispatcher.probe("/healthz")[0] == 200
    body = dispatcher.wait_probe("/readyz", 200)
    assert f"dispatcher serving on port {config.port}; 0 workers registered" in body
    assert (work_dir / "tf_data_dispatcher_journal").is_dir()
    assert f"work_dir={work_dir}, fault_tolerant_mode=True" in dispatcher.log()
    assert dispatcher.terminate(timeout=15) == 0, dispatcher.log()


def test_static_dispatcher_deletes_the_journals_it_replaces_once_started(launch: Launch, tmp_path: Path) -> None:
    for old in ("2-workers-g1", "2-workers", "4-workers-g9"):
        (tmp_path / old / "tf_data_dispatcher_journal").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    (tmp_path / "2-workers.txt").write_text("not a journal")
    own = tmp_path / "3-workers-g5"
    config = DispatcherServerConfig(
        port=free_port(),
        health_port=free_port(),
        work_dir=str(own),
        fault_tolerant_mode=True,
        worker_addresses=tuple(f"127.0.0.1:{free_port()}" for _ in range(3)),
        prune_old_journals=True,
    )
    dispatcher = launch(config)
    # Not ready (no worker registers here), but started: the old journals go.
    dispatcher.wait_probe("/readyz", 503, contains="0 of 3 workers registered")
    wait_for(
        "the old journals to be deleted",
        lambda: (
            True if sorted(p.name for p in tmp_path.iterdir()) == ["2-workers.txt", "3-workers-g5", "notes"] else None
        ),
        lambda: f"{sorted(p.name for p in tmp_path.iterdir())}\n--- dispatcher log ---\n{dispatcher.log()}",
        START_TIMEOUT,
    )
    assert f"deleted the old journal {tmp_path}/2-workers-g1 (this dispatcher journals in {own})" in dispatcher.log()
    assert (own / "tf_data_dispatcher_journal").is_dir()
    assert dispatcher.terminate(timeout=15) == 0, dispatcher.log()


def test_a_dispatcher_does_not_start_in_a_work_dir_another_service_claimed(launch: Launch, tmp_path: Path) -> None:
    """Two static services given one workDir: the second would prune the first's journal (review O7)."""

    def static(owner: str, workers: int) -> DispatcherServerConfig:
        return DispatcherServerConfig(
            port=free_port(),
            health_port=free_port(),
            work_dir=str(tmp_path / f"{workers}-workers-g1"),
            fault_tolerant_mode=True,
            worker_addresses=tuple(f"127.0.0.1:{free_port()}" for _ in range(workers)),
            prune_old_journals=True,
            owner=owner,
            owner_marker=str(tmp_path / serverconfig.OWNER_MARKER_NAME),
        )

    first = launch(static("team-a/reader", 2))
    first.wait_probe("/readyz", 503, contains="0 of 2 workers registered")  # started on its journal
    assert first.terminate(timeout=15) == 0, first.log()
    assert (tmp_path / serverconfig.OWNER_MARKER_NAME).read_text() == "team-a/reader\n"
    before = {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert any(name.startswith("2-workers-g1/tf_data_dispatcher_journal/") for name in before), before

    second = launch(static("team-b/reader", 3))
    code = second.wait_exit(START_TIMEOUT)
    log = second.log()
    assert code == 1, log
    assert f"the work directory {tmp_path} belongs to TFDataService team-a/reader" in log
    assert "Give each service its own spec.dispatcher.workDir." in log
    # Nothing touched: the first's journal is not pruned, the second's never created.
    assert {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "3-workers-g1").exists()


def test_sigterm_while_a_worker_waits_for_its_dispatcher_exits_0(launch: Launch) -> None:
    # TensorFlow's start() holds the GIL until a dispatcher accepts the worker: only the
    # supervisor process can still answer probes and signals.
    worker = launch(worker_config(dispatcher_port=free_port()), pod_name=POD_NAME)
    worker.wait_probe("/readyz", 503, contains="registering with dispatcher")
    assert worker.probe("/healthz")[0] == 200
    code = worker.terminate(timeout=10)
    assert code == 0, worker.log()
    assert "received SIGTERM; stopping the worker" in worker.log()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["worker"], {}, "no configuration: pass --config FILE or set TFDATA_SERVER_CONFIG"),
        (["dispatcher"], {"TFDATA_SERVER_CONFIG": "{not json"}, "configuration is not valid JSON"),
        (
            ["dispatcher"],
            {"TFDATA_SERVER_CONFIG": '{"kind": "worker"}'},
            "configuration is for a 'worker', but this server runs as a 'dispatcher'",
        ),
        (
            ["dispatcher"],
            {"TFDATA_SERVER_CONFIG": '{"kind": "dispatcher", "port": 5050, "health_port": 5050}'},
            "port and health_port must differ",
        ),
        (
            ["worker"],
            {
                "TFDATA_SERVER_CONFIG": serverconfig.to_json(
                    WorkerServerConfig(5051, 8080, "d:5050", serverconfig.POD_NAME_PLACEHOLDER + ":5051")
                )
            },
            "POD_NAME is not set",
        ),
        (["worker", "--config", "/nonexistent/config.json"], {}, "cannot read configuration file"),
    ],
    ids=["none", "not-json", "wrong-kind", "same-ports", "worker-without-pod-name", "missing-file"],
)
def test_bad_configuration_exits_2_with_one_line(
    argv: list[str], env: dict[str, str], message: str, server_tf: ServerTensorFlow
) -> None:
    command = [*server_tf.server_command(argv[0]), *argv[1:]]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tfdata-server: invalid configuration: "), lines[0]
    assert message in lines[0]


def _logs(cluster: StaticCluster) -> str:
    return "\n".join(f"--- {p.kind} log ---\n{p.log()}" for p in [cluster.dispatcher, *cluster.workers])


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"job_gc_check_interval_ms": 0, "job_gc_timeout_ms": 0, "worker_timeout_ms": 0},
        {
            "work_dir": "/journal",
            "fault_tolerant_mode": True,
            "worker_addresses": ("w-0.w:5051", "w-1.w:5051"),
            "job_gc_check_interval_ms": 1000,
            "job_gc_timeout_ms": 2000,
            "worker_timeout_ms": 3000,
            "worker_max_concurrent_snapshots": 2,
        },
    ],
    ids=["unset", "zeros", "all-set"],
)
def test_dispatcher_proto_matches_what_tensorflows_own_config_builds(fields: dict[str, Any]) -> None:
    from tensorflow.core.protobuf import service_config_pb2

    from tfdata_operator.server import tfconfig

    # Where ours leaves a timing unset the server runs serverconfig.DEFAULTS, not TensorFlow's.
    timings = ("job_gc_check_interval_ms", "job_gc_timeout_ms")
    defaults = {name: serverconfig.DEFAULTS[name] for name in timings if name not in fields}
    theirs = tf_service().DispatcherConfig(port=5050, **fields, **defaults)
    ours = tfconfig.dispatcher_config_proto(DispatcherServerConfig(port=5050, health_port=8080, **fields))
    expected = service_config_pb2.DispatcherConfig(**theirs._asdict())
    expected.client_timeout_ms = serverconfig.DEFAULTS["client_timeout_ms"]
    expected.gc_dynamic_sharding_jobs = serverconfig.DEFAULTS["gc_dynamic_sharding_jobs"]
    assert ours == expected


def test_dispatcher_proto_keeps_jobs_forever_when_asked() -> None:
    from tfdata_operator.server import tfconfig

    config = DispatcherServerConfig(port=5050, health_port=8080, job_gc_timeout_ms=-1, gc_dynamic_sharding_jobs=False)
    proto = tfconfig.dispatcher_config_proto(config)
    assert (proto.job_gc_timeout_ms, proto.gc_dynamic_sharding_jobs) == (-1, False)


def test_dispatcher_proto_carries_client_timeout() -> None:
    from tfdata_operator.server import tfconfig

    config = DispatcherServerConfig(port=5050, health_port=8080, client_timeout_ms=45000)
    assert tfconfig.dispatcher_config_proto(config).client_timeout_ms == 45000


@pytest.mark.parametrize(
    "fields",
    [{}, {"heartbeat_interval_ms": 500, "dispatcher_timeout_ms": 60000}],
    ids=["unset", "set"],
)
def test_worker_proto_matches_tensorflow_but_announces_the_pod(fields: dict[str, Any]) -> None:
    from tensorflow.core.protobuf import service_config_pb2

    from tfdata_operator.server import tfconfig

    config = WorkerServerConfig(
        port=5051, health_port=8080, dispatcher_address="d.ns:5050", worker_address_format="{pod_name}.w:5051", **fields
    )
    ours = tfconfig.worker_config_proto(config, "w-0")
    heartbeat = {"heartbeat_interval_ms": serverconfig.DEFAULTS["heartbeat_interval_ms"], **fields}
    theirs = service_config_pb2.WorkerConfig(
        **tf_service()
        .WorkerConfig(dispatcher_address="d.ns:5050", worker_address="w-0.w:5051", port=5051, **heartbeat)
        ._asdict()
    )
    # TensorFlow's namedtuple defaults the data transfer address to localhost; we never announce localhost.
    theirs.ClearField("data_transfer_address")
    assert ours == theirs


def test_worker_proto_announces_the_pod_for_data_transfer_too() -> None:
    from tfdata_operator.server import tfconfig

    config = WorkerServerConfig(
        port=5051,
        health_port=8080,
        dispatcher_address="d.ns:5050",
        worker_address_format="{pod_name}.w:5051",
        data_transfer_protocol="grpc",
        data_transfer_port=5052,
        data_transfer_address_format="{pod_name}.w:%dts_port%",
    )
    proto = tfconfig.worker_config_proto(config, "w-3")
    assert (proto.worker_address, proto.data_transfer_address) == ("w-3.w:5051", "w-3.w:%dts_port%")
    assert (proto.data_transfer_protocol, proto.data_transfer_port) == ("grpc", 5052)


def test_worker_proto_carries_the_cross_trainer_cache_size_only_when_set() -> None:
    """TensorFlow's WorkerConfig namedtuple has no such field; the proto, from 2.16 on, does."""
    from tfdata_operator.server import tfconfig

    config = WorkerServerConfig(
        port=5051, health_port=8080, dispatcher_address="d.ns:5050", worker_address_format="{pod_name}.w:5051"
    )
    assert tfconfig.worker_config_proto(config, "w-0").cross_trainer_cache_size_bytes == 0  # TensorFlow's 10 GiB
    cached = dataclasses.replace(config, cross_trainer_cache_size_bytes=3 * 2**30)
    assert tfconfig.worker_config_proto(cached, "w-0").cross_trainer_cache_size_bytes == 3 * 2**30
    assert "cross_trainer_cache_size_bytes" not in tf_service().WorkerConfig._fields


def tf_service() -> Any:
    import tensorflow as tf

    return tf.data.experimental.service
