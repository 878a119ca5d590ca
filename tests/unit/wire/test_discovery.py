"""The ConfigMap trainers discover a service with, and the client side that reads it back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings
from tfdata_operator.wire import discovery, serverinfo, signals

from fixtures.cases import parse


def test_client_configmap_is_owned_labelled_and_holds_every_setting(settings: BuildSettings) -> None:
    svc = parse(shardingPolicy="FILE", workers={"dataTransferProtocol": "grpc"}, dispatcher={"healthPort": 9090})
    cm = builders.build_client_configmap(svc, settings)
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["name"] == "demo-client"
    assert cm["metadata"]["namespace"] == "ml"
    assert cm["metadata"]["ownerReferences"] == [builders.owner_reference(svc)]
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tfdata-operator"
    assert cm["data"] == {
        "TFDATA_SERVICE_ADDRESS": "grpc://demo-dispatcher.ml.svc.cluster.local:5050",
        "TFDATA_SHARDING_POLICY": "FILE",
        "TFDATA_PROCESSING_MODE": "FILE",
        "TFDATA_SERVICE_NAME": "demo",
        "TFDATA_SERVICE_NAMESPACE": "ml",
        "TFDATA_DATA_TRANSFER_PROTOCOL": "grpc",
        "TFDATA_REPORT_URL": f"http://demo-dispatcher.ml.svc.cluster.local:9090{signals.REPORT_PATH}",
        "TFDATA_SERVER_INFO_URL": f"http://demo-dispatcher.ml.svc.cluster.local:9090{serverinfo.INFO_PATH}",
    }
    # ConfigMap keys become env names and file names: both must be valid as such.
    assert all(k.isidentifier() and k.isupper() for k in cm["data"])
    # The operator reads the signals where the trainers send their reports.
    signals_url = builders.dispatcher_health_url(svc, settings, signals.SIGNALS_PATH)
    assert signals_url == f"http://demo-dispatcher.ml.svc.cluster.local:9090{signals.SIGNALS_PATH}"


@pytest.mark.parametrize("policy", ["OFF", "DYNAMIC", "FILE", "DATA", "FILE_OR_DATA", "HINT"])
def test_what_the_operator_writes_the_client_reads_back(settings: BuildSettings, policy: str) -> None:
    svc = parse(shardingPolicy=policy)
    data = builders.build_client_configmap(svc, settings)["data"]
    assert "TFDATA_DATA_TRANSFER_PROTOCOL" not in data  # unset stays unset rather than empty
    read = discovery.load("demo", environ=data, directory="/nonexistent")
    assert read == builders.client_settings(svc, settings)
    assert read.processing_mode == policy
    assert read.is_static == svc.is_static


def test_mounted_configmap_is_read_from_its_directory(tmp_path: Path, settings: BuildSettings) -> None:
    data = builders.build_client_configmap(parse(shardingPolicy="DYNAMIC"), settings)["data"]
    (tmp_path / "demo").mkdir()
    for key, value in data.items():
        (tmp_path / "demo" / key).write_text(value)
    read = discovery.load("demo", environ={}, directory=tmp_path)
    assert read.address == data["TFDATA_SERVICE_ADDRESS"]
    read = discovery.load("demo", environ={discovery.DIR_ENV: str(tmp_path)})
    assert read.sharding_policy == "DYNAMIC"


def test_settings_for_another_service_are_never_used(tmp_path: Path, settings: BuildSettings) -> None:
    env = builders.build_client_configmap(parse(shardingPolicy="DYNAMIC"), settings)["data"]
    with pytest.raises(discovery.DiscoveryError, match=r"service 'imagenet'.*the environment is for service 'demo'"):
        discovery.load("imagenet", environ=env, directory=tmp_path)
    assert discovery.load(None, environ=env, directory=tmp_path).service_name == "demo"


def test_nothing_published_says_how_to_publish(tmp_path: Path) -> None:
    with pytest.raises(discovery.DiscoveryError, match=r"ConfigMap 'imagenet-client' with envFrom.*address="):
        discovery.load("imagenet", environ={}, directory=tmp_path)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TFDATA_SERVICE_ADDRESS": "grpc://x:1"}, "lacks TFDATA_SHARDING_POLICY"),
        ({"TFDATA_SERVICE_ADDRESS": "grpc://x:1", "TFDATA_SHARDING_POLICY": "SOMETIMES"}, "must be one of OFF"),
        (
            {"TFDATA_SERVICE_ADDRESS": "grpc://x:1", "TFDATA_SHARDING_POLICY": "FILE", "TFDATA_PROCESSING_MODE": "OFF"},
            "sharded with FILE needs 'FILE'",
        ),
    ],
)
def test_bad_published_settings_say_what_to_fix(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(discovery.DiscoveryError, match=message):
        discovery.load(None, environ=env, directory=tmp_path)


def test_processing_modes_accept_tensorflow_spellings() -> None:
    assert discovery.normalize_mode("distributed_epoch") == "DYNAMIC"
    assert discovery.normalize_mode("parallel_epochs") == "OFF"
    assert discovery.normalize_mode("ShardingPolicy.FILE") == "FILE"
    assert discovery.normalize_mode("hint") == "HINT"
    with pytest.raises(discovery.DiscoveryError, match="unknown processing mode 'sometimes'"):
        discovery.normalize_mode("sometimes")


def test_what_the_servers_reported_is_published_once_they_have(settings: BuildSettings) -> None:
    svc = parse(shardingPolicy="DYNAMIC")
    assert "TFDATA_SERVER_TENSORFLOW" not in builders.build_client_configmap(svc, settings)["data"]
    reported = {"tensorflowVersion": "2.16.2", "graphDefVersion": 1766, "preloadedOps": ["TFText>A", "TFText>B"]}
    data = builders.build_client_configmap(svc, settings, reported)["data"]
    assert data["TFDATA_SERVER_TENSORFLOW"] == "2.16.2"
    assert data["TFDATA_SERVER_GRAPH_DEF_VERSION"] == "1766"
    assert data["TFDATA_SERVER_PRELOADED_OPS"] == "TFText>A,TFText>B"
    read = discovery.from_data(data, "the ConfigMap")
    assert (read.server_tensorflow, read.server_graph_def_version) == ("2.16.2", "1766")


@pytest.mark.parametrize("directory", ["gs://bucket/tfdata", "/snapshots"])
def test_with_spec_snapshots_the_configmap_publishes_the_directory_and_the_progress_url(
    settings: BuildSettings, directory: str
) -> None:
    svc = parse(shardingPolicy="DYNAMIC", snapshots={"directory": directory}, dispatcher={"healthPort": 9090})
    data = builders.build_client_configmap(svc, settings)["data"]
    assert data["TFDATA_SNAPSHOT_DIR"] == directory
    assert data["TFDATA_SNAPSHOTS_URL"] == "http://demo-dispatcher.ml.svc.cluster.local:9090/v1/snapshots"
    # The trainer's helper reads both back (client.snapshots: save, wait, progress).
    read = discovery.load("demo", environ=data, directory="/nonexistent")
    assert (read.snapshot_dir, read.snapshots_url) == (directory, data["TFDATA_SNAPSHOTS_URL"])


def test_without_spec_snapshots_neither_snapshot_key_is_published(settings: BuildSettings) -> None:
    data = builders.build_client_configmap(parse(shardingPolicy="DYNAMIC"), settings)["data"]
    assert "TFDATA_SNAPSHOT_DIR" not in data and "TFDATA_SNAPSHOTS_URL" not in data
