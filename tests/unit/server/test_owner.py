"""The owner marker of a user's workDir: a dispatcher refuses a workDir another service claimed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tfdata_operator.server import owner
from tfdata_operator.server.journal import LocalFileSystem
from tfdata_operator.server.owner import Verdict


@pytest.mark.parametrize(
    ("marker", "verdict"),
    [
        (None, Verdict.CLAIM),  # no marker: a new workDir, or one from before markers
        ("", Verdict.CLAIM),  # a write cut short on a local disk
        ("ml/demo\n", Verdict.OURS),
        ("ml/demo", Verdict.OURS),
        ("other/demo\n", Verdict.FOREIGN),
        ("ml/demo-2\n", Verdict.FOREIGN),
        ("garbage written by hand", Verdict.FOREIGN),
    ],
)
def test_decide(marker: str | None, verdict: Verdict) -> None:
    assert owner.decide(marker, "ml/demo") is verdict


def test_a_foreign_marker_says_who_owns_the_work_dir_and_what_to_do(tmp_path: Path) -> None:
    marker = tmp_path / "tfdata-owner"
    marker.write_text("team-a/reader\n")
    journal = tmp_path / "2-workers-g1"
    journal.mkdir()
    refused = owner.claim(LocalFileSystem(), str(marker), "team-b/reader", logging.getLogger("test"))
    assert refused is not None
    assert f"the work directory {tmp_path} belongs to TFDataService team-a/reader" in refused
    assert "the dispatcher of team-b/reader does not start" in refused
    assert refused.endswith("Give each service its own spec.dispatcher.workDir.")
    assert marker.read_text() == "team-a/reader\n"  # the owner's marker is left as it was


def test_a_missing_marker_is_written_and_then_ours(tmp_path: Path) -> None:
    marker = tmp_path / "tfdata-owner"
    fs, log = LocalFileSystem(), logging.getLogger("test")
    assert owner.claim(fs, str(marker), "ml/demo", log, sleep=no_wait) is None
    assert marker.read_text() == "ml/demo\n"
    assert owner.claim(fs, str(marker), "ml/demo", log) is None  # a restart
    assert owner.claim(fs, str(marker), "ml/other", log) is not None  # the next service given this workDir


def no_wait(_: float) -> None:
    """The settle, not waited for: each test interleaves the other dispatcher itself."""


class FlakyStore(LocalFileSystem):
    def read(self, path: str, offset: int = 0) -> bytes:
        raise OSError("503 Service Unavailable")


class LosingRace(LocalFileSystem):
    """Another service writes its marker between this one's write and its read back."""

    def write(self, path: str, data: bytes) -> None:
        super().write(path, b"ml/first\n")


def test_a_store_that_cannot_be_read_does_not_keep_the_dispatcher_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert owner.claim(FlakyStore(), str(tmp_path / "tfdata-owner"), "ml/demo", logging.getLogger("t")) is None
    assert "could not check the owner marker" in caplog.text and "503 Service Unavailable" in caplog.text


def test_the_marker_is_read_back_so_a_lost_race_refuses(tmp_path: Path) -> None:
    refused = owner.claim(LosingRace(), str(tmp_path / "tfdata-owner"), "ml/second", logging.getLogger("t"), no_wait)
    assert refused is not None and "belongs to TFDataService ml/first" in refused


def test_two_dispatchers_claiming_one_new_work_dir_at_once_end_with_exactly_one_owner(tmp_path: Path) -> None:
    """A reads nothing, B reads nothing, A writes, B writes: without the settle, A's read back could come
    before B's write and both would start. A reads back after the settle, when B's write has landed."""
    marker, log = str(tmp_path / "tfdata-owner"), logging.getLogger("t")
    verdicts: dict[str, str | None] = {}

    def a_settles(seconds: float) -> None:
        assert seconds == owner.SETTLE_SECONDS
        # Meanwhile B, which read "no marker" before A wrote, writes and reads back after its own settle.
        verdicts["ml/b"] = owner.claim(BlindStore(), marker, "ml/b", log, sleep=lambda _: None)

    verdicts["ml/a"] = owner.claim(LocalFileSystem(), marker, "ml/a", log, sleep=a_settles)
    assert verdicts["ml/b"] is None  # B's write stands: it starts
    assert verdicts["ml/a"] is not None and "belongs to TFDataService ml/b" in verdicts["ml/a"]  # A does not
    assert Path(marker).read_text() == "ml/b\n"


class BlindStore(LocalFileSystem):
    """B's view: its first read found no marker (it came before A's write)."""

    def __init__(self) -> None:
        self.first = True

    def read(self, path: str, offset: int = 0) -> bytes:
        if self.first:
            self.first = False
            raise FileNotFoundError(path)
        return super().read(path, offset)


def test_a_claim_waits_once_and_a_restart_does_not_wait(tmp_path: Path) -> None:
    marker, log, waits = str(tmp_path / "tfdata-owner"), logging.getLogger("t"), []
    assert owner.claim(LocalFileSystem(), marker, "ml/demo", log, sleep=waits.append) is None
    assert owner.claim(LocalFileSystem(), marker, "ml/demo", log, sleep=waits.append) is None
    assert waits == [owner.SETTLE_SECONDS]
