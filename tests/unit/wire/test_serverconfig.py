"""The pods' configuration model: what the operator writes is what tfdata-server reads, or a clear error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tfdata_operator.wire import serverconfig
from tfdata_operator.wire.serverconfig import ConfigError, DispatcherServerConfig, WorkerServerConfig

DISPATCHER = DispatcherServerConfig(
    port=5050,
    health_port=8080,
    work_dir="/journal/2-workers-g3",
    fault_tolerant_mode=True,
    worker_addresses=("w-0.w.ns.svc:5051", "w-1.w.ns.svc:5051"),
    prune_old_journals=True,
    job_gc_check_interval_ms=1000,
    job_gc_timeout_ms=2000,
    client_timeout_ms=3000,
    worker_timeout_ms=4000,
    worker_max_concurrent_snapshots=2,
    snapshot_dir="gs://bucket/snapshots",
    owner="ns/svc",
    owner_marker="/journal/tfdata-owner",
)
WORKER = WorkerServerConfig(
    port=5051,
    health_port=8081,
    dispatcher_address="d.ns.svc:5050",
    worker_address_format="{pod_name}.w.ns.svc:5051",
    heartbeat_interval_ms=500,
    dispatcher_timeout_ms=60000,
    data_transfer_protocol="grpc",
    data_transfer_port=5052,
    data_transfer_address_format="{pod_name}.w.ns.svc:%dts_port%",
    cross_trainer_cache_size_bytes=4 * 2**30,
)


def dispatcher_json(**fields: Any) -> str:
    return json.dumps({"kind": "dispatcher", "port": 5050, "health_port": 8080, **fields})


def worker_json(**fields: Any) -> str:
    base = {
        "port": 5051,
        "health_port": 8081,
        "dispatcher_address": "d:5050",
        "worker_address_format": "{pod_name}:5051",
    }
    return json.dumps({"kind": "worker", **base, **fields})


@pytest.mark.parametrize("config", [DISPATCHER, WORKER, DispatcherServerConfig(port=1, health_port=2)], ids=repr)
def test_round_trip(config: serverconfig.ServerConfig) -> None:
    kind = "dispatcher" if isinstance(config, DispatcherServerConfig) else "worker"
    assert serverconfig.from_json(serverconfig.to_json(config), kind) == config


def test_json_is_deterministic_and_leaves_out_unset_fields() -> None:
    text = serverconfig.to_json(DispatcherServerConfig(port=5050, health_port=8080))
    assert text == '{"fault_tolerant_mode":false,"health_port":8080,"kind":"dispatcher","port":5050,"protocol":"grpc"}'
    # Added later, so left out at its default: an upgraded operator does not restart every dispatcher.
    assert '"prune_old_journals":true' in serverconfig.to_json(DISPATCHER)
    # A configuration written before snapshot_dir existed reads as a service without spec.snapshots.
    older = serverconfig.from_json(dispatcher_json(work_dir="/j", fault_tolerant_mode=True), "dispatcher")
    assert isinstance(older, DispatcherServerConfig) and older.snapshot_dir is None
    # One written before the owner marker: a dispatcher that claims no workDir.
    assert isinstance(older, DispatcherServerConfig) and (older.owner, older.owner_marker) == (None, None)


def test_worker_announces_its_pod_name_never_localhost() -> None:
    assert WORKER.worker_address("w-3") == "w-3.w.ns.svc:5051"
    assert WORKER.data_transfer_address("w-3") == "w-3.w.ns.svc:%dts_port%"
    assert WorkerServerConfig(5051, 8081, "d:5050", "{pod_name}:5051").data_transfer_address("w-3") is None
    # The dispatcher's static list is built with the same function, so the two always agree.
    assert serverconfig.worker_address("{pod_name}.w:1", "w-0") == "w-0.w:1"


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ("{not json", "dispatcher", "configuration is not valid JSON"),
        ("[1, 2]", "dispatcher", "configuration must be a JSON object"),
        (worker_json(), "dispatcher", "configuration is for a 'worker', but this server runs as a 'dispatcher'"),
        ('{"port": 5050, "health_port": 8080}', "dispatcher", "configuration is for a None"),
        (dispatcher_json(jobs=3), "dispatcher", "unknown configuration keys ['jobs']"),
        ('{"kind": "dispatcher", "port": 5050}', "dispatcher", "incomplete configuration"),
        (dispatcher_json(port=0), "dispatcher", "port must be an integer port in 1..65535, got 0"),
        (dispatcher_json(port=70000), "dispatcher", "got 70000"),
        (dispatcher_json(port="5050"), "dispatcher", "port must be an integer, got '5050'"),
        (dispatcher_json(port=True), "dispatcher", "port must be an integer, got True"),
        (dispatcher_json(port=None), "dispatcher", "port must be an integer, got None"),
        (dispatcher_json(health_port=5050), "dispatcher", "port and health_port must differ"),
        (dispatcher_json(fault_tolerant_mode=True), "dispatcher", "fault_tolerant_mode needs work_dir"),
        (dispatcher_json(fault_tolerant_mode="yes"), "dispatcher", "fault_tolerant_mode must be true or false"),
        (dispatcher_json(protocol=7), "dispatcher", "protocol must be a string, got 7"),
        (dispatcher_json(worker_addresses=[]), "dispatcher", "must list at least one worker"),
        (dispatcher_json(worker_addresses=["a:1", "a:1"]), "dispatcher", "worker_addresses has duplicates"),
        (dispatcher_json(worker_addresses="a:1"), "dispatcher", "worker_addresses must be a list of strings"),
        (dispatcher_json(worker_addresses=[1]), "dispatcher", "worker_addresses must be a list of strings"),
        (dispatcher_json(job_gc_timeout_ms=-5), "dispatcher", "job_gc_timeout_ms must be an integer of at least -1"),
        (dispatcher_json(client_timeout_ms=True), "dispatcher", "client_timeout_ms must be an integer, got True"),
        (dispatcher_json(prune_old_journals=True), "dispatcher", "prune_old_journals needs a work_dir whose last"),
        (dispatcher_json(prune_old_journals=True, work_dir="/j/"), "dispatcher", "static journal name"),
        (dispatcher_json(snapshot_dir="snaps"), "dispatcher", "snapshot_dir must be an absolute path or a URL"),
        (dispatcher_json(snapshot_dir=""), "dispatcher", "snapshot_dir must be an absolute path or a URL"),
        (dispatcher_json(snapshot_dir=["/s"]), "dispatcher", "snapshot_dir must be a string"),
        (dispatcher_json(work_dir="/j", owner="ns/svc"), "dispatcher", "owner and owner_marker are set together"),
        (
            dispatcher_json(work_dir="/j", owner="svc", owner_marker="/j/tfdata-owner"),
            "dispatcher",
            "owner must be <namespace>/<name> of a TFDataService, got 'svc'",
        ),
        (dispatcher_json(owner="ns/svc", owner_marker="/j/tfdata-owner"), "dispatcher", "owner_marker needs work_dir"),
        (
            dispatcher_json(work_dir="/j/2-workers-g1", owner="ns/svc", owner_marker="/elsewhere/tfdata-owner"),
            "dispatcher",
            "owner_marker must be tfdata-owner in work_dir or in its parent",
        ),
        (
            dispatcher_json(work_dir="/j", owner="ns/svc", owner_marker="/j/owner.txt"),
            "dispatcher",
            "owner_marker must be tfdata-owner",
        ),
        # An optional field left null does not end the type checks of the fields after it.
        (
            dispatcher_json(work_dir=None, fault_tolerant_mode="yes"),
            "dispatcher",
            "fault_tolerant_mode must be true or",
        ),
        (worker_json(dispatcher_address="grpc://d:5050"), "worker", "dispatcher_address must be host:port"),
        (worker_json(dispatcher_address=5050), "worker", "dispatcher_address must be a string, got 5050"),
        (worker_json(worker_address_format="w-0:5051"), "worker", "worker_address_format must contain {pod_name}"),
        (worker_json(heartbeat_interval_ms=0), "worker", "heartbeat_interval_ms must be a positive integer"),
        (worker_json(data_transfer_port=0), "worker", "data_transfer_port must be an integer port"),
        (
            worker_json(cross_trainer_cache_size_bytes=0),
            "worker",
            "cross_trainer_cache_size_bytes must be a positive integer, got 0",
        ),
        (
            worker_json(cross_trainer_cache_size_bytes="4Gi"),
            "worker",
            "cross_trainer_cache_size_bytes must be an integer",
        ),
    ],
)
def test_bad_configuration_says_what_to_fix(text: str, kind: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        serverconfig.from_json(text, kind)
    assert message in str(error.value)


def test_load_prefers_the_file_over_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(serverconfig.to_json(DISPATCHER))
    environ = {serverconfig.CONFIG_ENV: dispatcher_json()}
    assert serverconfig.load("dispatcher", str(path), environ) == DISPATCHER
    assert serverconfig.load("dispatcher", None, environ) == DispatcherServerConfig(port=5050, health_port=8080)


@pytest.mark.parametrize(
    ("path", "environ", "message"),
    [
        (None, {}, "no configuration: pass --config FILE or set TFDATA_SERVER_CONFIG"),
        (None, {serverconfig.CONFIG_ENV: ""}, "no configuration"),
        ("/nonexistent/config.json", {}, "cannot read configuration file /nonexistent/config.json"),
    ],
)
def test_load_without_configuration(path: str | None, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        serverconfig.load("worker", path, environ)
    assert message in str(error.value)


def _refusal(text: str, kind: str) -> str:
    with pytest.raises(ConfigError) as error:
        serverconfig.from_json(text, kind)
    return str(error.value)


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ("[1, 2]", "dispatcher", "configuration must be a JSON object"),
        (dispatcher_json(health_port=0), "dispatcher", "health_port must be an integer port in 1..65535, got 0"),
        (dispatcher_json(fault_tolerant_mode=True), "dispatcher",
         "fault_tolerant_mode needs work_dir: set work_dir to a journal location"),
        (dispatcher_json(worker_addresses=[]), "dispatcher",
         "worker_addresses, when set, must list at least one worker"),
        (dispatcher_json(worker_health_port=65536), "dispatcher",
         "worker_health_port must be an integer port in 1..65535, got 65536"),
        (dispatcher_json(job_gc_check_interval_ms=-1), "dispatcher",
         "job_gc_check_interval_ms must be an integer of at least 0, got -1"),
        (worker_json(port=65536), "worker", "port must be an integer port in 1..65535, got 65536"),
        (worker_json(health_port=65536), "worker", "health_port must be an integer port in 1..65535, got 65536"),
        (worker_json(health_port=5051), "worker", "port and health_port must differ (both are 5051)"),
        (worker_json(heartbeat_interval_ms=True), "worker", "heartbeat_interval_ms must be an integer, got True"),
        (dispatcher_json(prune_old_journals=True, work_dir="/j/x"), "dispatcher",
         "prune_old_journals needs a work_dir whose last component is a static journal name "
         "(<N>-workers-g<generation>), got '/j/x'"),
        (worker_json(preload_modules=["tensorflow_text", "tensorflow-io"]), "worker",
         "preload_modules: 'tensorflow-io' is not a Python module name (like tensorflow_text)"),
        (dispatcher_json(preload_op_libraries=["/opt/ops/a.so", "ops/b.so"]), "dispatcher",
         "preload_op_libraries: 'ops/b.so' must be an absolute path to a shared library"),
        (dispatcher_json(work_dir="/j", owner_marker="/j/tfdata-owner"), "dispatcher",
         "owner and owner_marker are set together or not at all"),
        (dispatcher_json(owner="ns/svc", owner_marker="/j/tfdata-owner"), "dispatcher",
         "owner_marker needs work_dir: the marker is in the journal's location"),
    ],
)  # fmt: skip
def test_each_refusal_is_one_whole_sentence(text: str, kind: str, message: str) -> None:
    assert _refusal(text, kind) == message


def test_the_edges_of_every_range_are_accepted() -> None:
    serverconfig.from_json(dispatcher_json(port=65535, health_port=1, worker_health_port=65535), "dispatcher")
    serverconfig.from_json(dispatcher_json(job_gc_timeout_ms=-1, job_gc_check_interval_ms=0), "dispatcher")
    serverconfig.from_json(worker_json(heartbeat_interval_ms=1, data_transfer_port=65535), "worker")
    # The journal's name is the last component of work_dir, a trailing slash or not:
    for work_dir in ("/var/lib/tfdata/journal/3-workers-g2/", "journal/3-workers", "3-workers-g2"):
        pruning = dispatcher_json(prune_old_journals=True, work_dir=work_dir)
        assert serverconfig.from_json(pruning, "dispatcher").prune_old_journals  # type: ignore[union-attr]
    # Only the last component counts, and only slashes are trimmed from its end.
    for work_dir in ("/3-workers/x", "/j/2-workers-g1/X", "/j/2-workers-g1X"):
        refusal = _refusal(dispatcher_json(prune_old_journals=True, work_dir=work_dir), "dispatcher")
        assert "static journal name" in refusal, work_dir


@pytest.mark.parametrize(
    ("work_dir", "owner_marker"),
    [
        ("/j/2-workers-g1", "/j/2-workers-g1/tfdata-owner"),
        ("/j/2-workers-g1/", "/j/2-workers-g1/tfdata-owner"),
        ("/j/2-workers-g1", "/j/tfdata-owner"),
        ("/j/2-workers-g1/", "/j/tfdata-owner"),
        # Only slashes are trimmed from work_dir's end: a last component ending in X is kept.
        ("/j/X", "/j/X/tfdata-owner"),
    ],
)
def test_the_owner_marker_is_accepted_in_work_dir_or_its_parent_with_or_without_a_trailing_slash(
    work_dir: str, owner_marker: str
) -> None:
    text = dispatcher_json(work_dir=work_dir, owner="ns/svc", owner_marker=owner_marker)
    config = serverconfig.from_json(text, "dispatcher")
    assert isinstance(config, DispatcherServerConfig) and config.owner_marker == owner_marker


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (DispatcherServerConfig(port=True, health_port=8080), "port must be an integer port in 1..65535, got True"),
        (DispatcherServerConfig(port=5050, health_port=8080, worker_poll_interval_ms=True),
         "worker_poll_interval_ms must be a positive integer, got True"),
        (dataclasses.replace(WORKER, heartbeat_interval_ms=False), "heartbeat_interval_ms must be a positive integer"),
    ],
)  # fmt: skip
def test_a_configuration_built_in_code_is_checked_like_one_read_from_json(
    config: DispatcherServerConfig | WorkerServerConfig, message: str
) -> None:
    """validate() on its own: a bool is not an integer here either (JSON's type check is not in the way)."""
    with pytest.raises(ConfigError) as error:
        config.validate()
    assert message in str(error.value)


def test_a_setting_left_out_runs_with_its_default_and_a_set_one_with_its_value() -> None:
    name = "heartbeat_interval_ms"
    assert serverconfig.setting(WORKER, name) == 500 != serverconfig.DEFAULTS[name]
    unset = WorkerServerConfig(port=1, health_port=2, dispatcher_address="d:1", worker_address_format="{pod_name}:1")
    assert serverconfig.setting(unset, name) == serverconfig.DEFAULTS[name]
