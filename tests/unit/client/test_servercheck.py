"""The servers check: missing ops named with their module and fix, TensorFlow refused or warned, skipped if unreadable.

The pipelines' real graphs and a real TensorFlow trainer: tests/server/test_trainer_client.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from tfdata_operator import client
from tfdata_operator.client import servercheck
from tfdata_operator.wire import discovery, serverinfo
from tfdata_operator.wire.serverinfo import GraphDefVersions, ServerInfo

from fixtures.support import Pages

TRAINER = GraphDefVersions(producer=2474, min_consumer=0, min_producer=0)
SERVICE = "TFDataService ml/imagenet"


def servers(ops: tuple[str, ...] = ("Const", "MapDataset", "RangeDataset"), producer: int = 2474) -> ServerInfo:
    return ServerInfo("2.21.0", "3.11.7", GraphDefVersions(producer, 0, 0), ops=ops)


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    servercheck._warned.clear()
    yield
    servercheck._warned.clear()


def test_a_missing_tftext_op_names_tensorflow_text_and_the_fix() -> None:
    used = {"Const", "MapDataset", "TFText>WhitespaceTokenizeWithOffsetsV2"}
    with pytest.raises(client.MissingOpError) as caught:
        servercheck.check(used, "2.21.0", TRAINER, servers(), SERVICE)
    assert isinstance(caught.value, client.ServerCheckError)
    assert str(caught.value) == (
        "TFDataService ml/imagenet's servers (TensorFlow 2.21.0) lack 1 op this pipeline uses: "
        "TFText>WhitespaceTokenizeWithOffsetsV2 (registered by tensorflow_text). To fix: add tensorflow_text to "
        "spec.preload.modules of TFDataService ml/imagenet and run it on an image that has tensorflow_text "
        "(spec.image)"
    )


def test_every_missing_op_is_named_and_unknown_ones_get_both_preload_fields() -> None:
    used = {"RangeDataset", "IO>AudioDecodeWav", "TFText>Foo", "SentencepieceOp>X", "ZeroOutCustom"}
    with pytest.raises(client.MissingOpError) as caught:
        servercheck.check(used, "2.22.0", TRAINER, servers(), SERVICE)
    message = str(caught.value)
    assert "lack 4 ops this pipeline uses: IO>AudioDecodeWav (registered by tensorflow_io), SentencepieceOp>X " in (
        message
    )
    assert message.count("add tensorflow_text to spec.preload.modules") == 1, "one fix per module"
    assert "add tensorflow_io to spec.preload.modules of TFDataService ml/imagenet" in message
    assert "for ZeroOutCustom: add what registers it to TFDataService ml/imagenet" in message
    assert "spec.preload.opLibraries" in message
    assert "run the servers on this trainer's TensorFlow 2.22.0 (spec.image)" in message


def test_a_trainer_older_than_the_servers_works_silently() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        servercheck.check({"Const", "RangeDataset"}, "2.20.0", GraphDefVersions(2400, 0, 0), servers(), SERVICE)


def test_servers_that_listed_no_ops_are_not_op_checked() -> None:
    servercheck.check({"AnythingAtAll"}, "2.21.0", TRAINER, servers(ops=()), SERVICE)


def test_refused_graph_def_versions_raise_with_the_reason() -> None:
    trainer = GraphDefVersions(producer=3000, min_consumer=2600, min_producer=0)
    with pytest.raises(client.IncompatibleTensorFlowError) as caught:
        servercheck.check({"Const"}, "3.0.0", trainer, servers(), SERVICE)
    message = str(caught.value)
    assert message.startswith("TFDataService ml/imagenet cannot run this trainer's pipeline: the servers run "
                              "TensorFlow 2.21.0, this trainer 3.0.0; ")  # fmt: skip
    assert serverinfo.compatibility(trainer, servers().graph_def).reason in message


def test_a_newer_trainer_is_warned_once_per_reason() -> None:
    newer = GraphDefVersions(producer=2475, min_consumer=0, min_producer=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            servercheck.check({"Const"}, "2.22.0", newer, servers(), SERVICE)
    assert [type(w.message) for w in caught] == [client.TensorFlowVersionWarning]
    assert "is newer than the servers' (2474)" in str(caught[0].message)


def test_a_newer_trainer_missing_an_op_says_both() -> None:
    newer = GraphDefVersions(producer=2475, min_consumer=0, min_producer=0)
    with pytest.raises(client.MissingOpError, match=r"lack 1 op this pipeline uses: NewOp\. .* Also, the trainer's"):
        servercheck.check({"NewOp"}, "2.22.0", newer, servers(), SERVICE)


def settings(url: str | None) -> discovery.ClientSettings:
    return discovery.ClientSettings(address="grpc://d:5050", sharding_policy="DYNAMIC", processing_mode="DYNAMIC",
                                    service_name="imagenet", namespace="ml", server_info_url=url)  # fmt: skip


def test_the_server_info_is_read_over_http() -> None:
    info = servers(ops=("Const", "Mul"))
    pages = Pages({serverinfo.INFO_PATH: serverinfo.to_json(info)})
    try:
        assert servercheck.fetch(pages.url(serverinfo.INFO_PATH)) == info
        assert pages.requests == [serverinfo.INFO_PATH]
    finally:
        pages.close()


@pytest.mark.parametrize(
    ("page", "status", "why"),
    [
        (None, None, "404: the servers' tfdata-server is older than this helper"),
        ("{}", None, "not a server info document"),
        (None, 503, "503: the servers' TensorFlow has not started yet"),
    ],
    ids=["older-server", "not-serverinfo", "not-started"],
)
def test_an_older_server_or_a_bad_document_skips_the_check_with_a_warning(
    page: str | None, status: int | None, why: str
) -> None:
    pages = Pages({serverinfo.INFO_PATH: page} if page else {}, {serverinfo.INFO_PATH: status} if status else {})
    try:
        url = pages.url(serverinfo.INFO_PATH)
        with pytest.warns(client.ServerCheckSkippedWarning) as caught:
            servercheck.check_servers(None, settings(url))  # the graph is never looked at
    finally:
        pages.close()
    assert str(caught[0].message).startswith(f"cannot read the servers' TensorFlow and ops from {url} ({why}")
    assert str(caught[0].message).endswith("the check that they can run this pipeline was skipped")


def test_an_unreachable_server_skips_the_check_with_a_warning() -> None:
    pages = Pages({})
    url = pages.url(serverinfo.INFO_PATH)
    pages.close()  # nothing listens there now
    with pytest.warns(client.ServerCheckSkippedWarning, match="Connection refused"):
        assert servercheck.fetch(url, timeout=2) is None
    with pytest.warns(client.ServerCheckSkippedWarning, match="unknown url type"):
        assert servercheck.fetch("dispatcher:9090/serverinfo") is None


def test_settings_without_a_server_info_url_are_not_checked() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        servercheck.check_servers(None, settings(None))


def test_the_service_is_named_as_precisely_as_the_settings_allow() -> None:
    assert servercheck.service_label(settings(None)) == "TFDataService ml/imagenet"
    bare = discovery.ClientSettings(address="grpc://d:5050", sharding_policy="OFF", processing_mode="OFF")
    assert servercheck.service_label(bare) == "the TFDataService at grpc://d:5050"
