"""Distributed snapshots without TensorFlow: the report's model, the files' layout, the journal, the
dispatcher's reader and its routes, and the client's waiting."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tfdata_operator.client import snapshots as client_snapshots
from tfdata_operator.server import health, probestate, tffiles
from tfdata_operator.server.aggregate import JournalClients
from tfdata_operator.server.journal import (
    JOURNAL_DIR,
    JournalTail,
    LocalFileSystem,
    forget_finished_snapshots,
    update_class,
)
from tfdata_operator.server.nofollow import NoFollowFileSystem
from tfdata_operator.server.snapshotfiles import read_progress
from tfdata_operator.server.snapshotproxy import proxy_route
from tfdata_operator.server.snapshots import SnapshotReader
from tfdata_operator.wire import discovery, snapshots
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsError, SnapshotsReport

from fixtures.cases import ROOT
from fixtures.deletion import until_ended
from fixtures.fakes import Clock

# What TensorFlow 2.21 wrote to ERROR for a map function whose assertion failed.
ERROR_FILE = (
    b"code: INVALID_ARGUMENT\n"
    b'message: "Error in user-defined function passed to MapDataset:8 transformation: assertion failed: '
    b'[x < y] \\"caf\\303\\251\\"\\n\\t [[{{node assert_less/Assert}}]]"\n'
)


def test_a_report_round_trips_and_what_the_operator_cannot_use_is_refused() -> None:
    report = SnapshotsReport(
        (
            SnapshotProgress("/data/a", snapshots.COMPLETED, True, 2, 2, 4, 1000, 11535, None, None, 10.0, 20.0, 1.5),
            SnapshotProgress("/data/b", snapshots.MISSING),
        ),
        "snapshots named in the journal at /work/tf_data_dispatcher_journal",
    )
    assert SnapshotsReport.from_json(report.to_json()) == report
    assert report.get("/data/b") == report.snapshots[1] and report.get("/data/c") is None
    # A newer dispatcher's extra field is ignored; an older one's missing optional fields read as defaults.
    entry = json.loads(report.to_json())["snapshots"][0]
    newer = {**entry, "shards": 3}
    assert snapshots.progress_from_dict(newer) == report.snapshots[0]
    assert snapshots.progress_from_dict({"path": "/x", "state": "MISSING"}) == SnapshotProgress("/x", "MISSING")
    for broken, message in [
        ({**entry, "state": "DONE"}, "state must be one of"),
        ({**entry, "elements": -1}, "elements must be an integer of at least 0"),
        ({**entry, "bytes": True}, "bytes must be an integer"),
        ({**entry, "streams_done": 3}, r"streams_done \(3\) exceeds streams_total \(2\)"),
        ({**entry, "error": 5}, "error must be a string or null"),
        ({**entry, "started_at": "now"}, "started_at must be a number"),
        ({"state": "MISSING"}, "missing fields in a snapshot entry: path"),
    ]:
        with pytest.raises(SnapshotsError, match=message):
            snapshots.progress_from_dict(broken)
    with pytest.raises(SnapshotsError, match="must be a JSON object"):
        SnapshotsReport.from_json("[]")
    with pytest.raises(SnapshotsError, match="journal must be a string"):
        SnapshotsReport.from_json('{"snapshots": []}')


def test_the_layout_tensorflow_writes_is_read_by_name() -> None:
    assert snapshots.chunk_elements("chunk_0_1_251") == 251
    for other in ("chunk_0_1", "chunk_a_1_2", "chunk_0_1_2.tmp", "checkpoint_2_505", "chunk_0_1_٣"):
        assert snapshots.chunk_elements(other) is None, other
    assert snapshots.state_from_names(["snapshot.metadata", "chunks/", "streams/"]) == snapshots.IN_PROGRESS
    assert snapshots.state_from_names(["snapshot.metadata", "DONE"]) == snapshots.COMPLETED
    assert snapshots.state_from_names(["snapshot.metadata", "DONE", "ERROR"]) == snapshots.FAILED
    assert snapshots.state_from_names(["other"]) == snapshots.UNKNOWN


def test_errors_text_reads_as_tensorflow_said_it() -> None:
    text = snapshots.error_text(ERROR_FILE)
    assert text.startswith("INVALID_ARGUMENT: Error in user-defined function passed to MapDataset:8"), text
    assert '[x < y] "café"\n\t [[{{node assert_less/Assert}}]]' in text, text
    assert snapshots.error_text(b"plain words\n") == "plain words"
    long = snapshots.error_text(b'code: INTERNAL\nmessage: "' + b"x" * 10_000 + b'"')
    assert len(long) == snapshots.MAX_ERROR_CHARACTERS and long.endswith("…")


def test_a_request_names_its_paths_within_bounds() -> None:
    assert snapshots.query_paths({"path": ["/a", "gs://b/c", "/a"]}) == ("/a", "gs://b/c")
    assert snapshots.query_paths({}) == ()
    with pytest.raises(SnapshotsError, match="unknown query parameters: paths"):
        snapshots.query_paths({"paths": ["/a"]})
    with pytest.raises(SnapshotsError, match="at most 64 paths"):
        snapshots.query_paths({"path": [f"/p{n}" for n in range(65)]})
    with pytest.raises(SnapshotsError, match="a path must be 1 to 4096 characters"):
        snapshots.query_paths({"path": [""]})


def write_snapshot(root: Path, chunks: dict[str, int], streams: dict[str, bool], final: str | None = None) -> Path:
    """A snapshot's files as TensorFlow lays them out: chunk name -> size, stream -> done."""
    (root / "chunks").mkdir(parents=True)
    (root / "snapshot.metadata").write_text('element_spec: "x"\ncompression: "SNAPPY"\n')
    for name, size in chunks.items():
        (root / "chunks" / name).write_bytes(b"c" * size)
    for stream, done in streams.items():
        (root / "streams" / stream).mkdir(parents=True)
        if done:
            (root / "streams" / stream / "DONE").write_bytes(b"")
    if final == "DONE":
        (root / "DONE").write_bytes(b"")
    elif final == "ERROR":
        (root / "ERROR").write_bytes(ERROR_FILE)
    return root


def test_one_snapshot_is_read_from_its_files(tmp_path: Path) -> None:
    fs = LocalFileSystem()
    path = write_snapshot(
        tmp_path / "s",
        {"chunk_0_0_254": 100, "chunk_1_0_253": 50, "chunk_0_1_2": 7, "tmp_chunk": 9},
        {"stream_0": True, "stream_1": False},
    )
    progress = read_progress(fs, str(path), journaled=True).progress
    assert progress.state == snapshots.IN_PROGRESS and progress.journaled, progress
    assert (progress.streams_done, progress.streams_total) == (1, 2), progress
    assert (progress.chunks, progress.elements, progress.bytes) == (3, 509, 157), progress
    assert progress.started_at is not None and progress.finished_at is None and progress.error is None
    (path / "streams" / "stream_1" / "DONE").write_bytes(b"")
    (path / "DONE").write_bytes(b"")
    done = read_progress(fs, str(path), journaled=True).progress
    assert (done.state, done.streams_done, done.streams_total) == (snapshots.COMPLETED, 2, 2), done
    assert done.finished_at is not None and "2/2 streams done, 509 elements" in done.describe()

    failed = read_progress(fs, str(write_snapshot(tmp_path / "f", {}, {"stream_0": False}, "ERROR")), False).progress
    assert failed.state == snapshots.FAILED and failed.error is not None, failed
    assert failed.error.startswith("INVALID_ARGUMENT: ") and failed.finished_at is not None, failed

    missing = read_progress(fs, str(tmp_path / "nothing"), journaled=False).progress
    assert missing == SnapshotProgress(str(tmp_path / "nothing"), snapshots.MISSING), missing
    (tmp_path / "plain").mkdir()
    plain = read_progress(fs, str(tmp_path / "plain"), journaled=False).progress
    assert plain.state == snapshots.UNKNOWN and "no snapshot.metadata" in (plain.detail or ""), plain
    (tmp_path / "file").write_text("x")
    assert read_progress(fs, str(tmp_path / "file"), journaled=False).progress.state == snapshots.MISSING


def journal_record(update: Any) -> bytes:
    data = update.SerializeToString()
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4  # CRCs are not checked


class CountingFileSystem(NoFollowFileSystem):
    """A snapshot's files as the reader reads them, each call counted in ``calls``."""

    def __init__(self, top: str, calls: list[tuple[str, str]]) -> None:
        super().__init__(top)
        self.calls = calls

    def listdir(self, path: str) -> list[str]:
        self.calls.append(("listdir", path))
        return super().listdir(path)

    def size_and_mtime(self, path: str) -> tuple[int, float]:
        self.calls.append(("stat", path))
        return super().size_and_mtime(path)


def test_the_reader_lists_the_journaled_snapshots_and_reuses_a_reading_briefly(tmp_path: Path) -> None:
    work_dir, data = tmp_path / "work", tmp_path / "data"
    journal = work_dir / JOURNAL_DIR / "journal_0"
    journal.parent.mkdir(parents=True)
    update = update_class()
    paths = [str(data / "a"), str(data / "b")]
    # Byte for byte what TensorFlow 2.21 journals for a distributed_save (field 15, its path field 1).
    assert update(snapshot={"path": "/tmp/snapx/run1/snap"}).SerializeToString() == (b"z\x16\n\x14/tmp/snapx/run1/snap")
    records = [journal_record(update(acquire={"client": 1})), journal_record(update(snapshot={"path": paths[0]}))]
    journal.write_bytes(b"".join(records))
    write_snapshot(data / "a", {"chunk_0_0_10": 5}, {"stream_0": False})
    clock, calls = Clock(100.0), list[tuple[str, str]]()
    reader = SnapshotReader(
        LocalFileSystem(), str(work_dir), str(data), clock, local_files=lambda top: CountingFileSystem(top, calls)
    )

    first = reader.report()
    assert [s.path for s in first.snapshots] == [paths[0]] and first.snapshots[0].journaled, first
    assert first.snapshots[0].state == snapshots.IN_PROGRESS
    # A second snapshot journaled, its record cut in two by the read.
    second = journal_record(update(snapshot={"path": paths[1]}))
    with open(journal, "ab") as f:
        f.write(second[:9])
    (data / "a" / "DONE").write_bytes(b"")
    clock.now += 1
    count = len(calls)
    again = reader.report()
    assert len(calls) == count, "a reading less than REREAD_SECONDS old is reused"
    assert again.snapshots[0].state == snapshots.IN_PROGRESS and again.snapshots[0].age_seconds == 1.0
    with open(journal, "ab") as f:
        f.write(second[9:])
    clock.now += 5
    later = reader.report()
    assert [(s.path, s.state) for s in later.snapshots] == [
        (paths[0], snapshots.COMPLETED),
        (paths[1], snapshots.MISSING),
    ], later
    chunk_stats = [c for c in calls if c[0] == "stat" and "/chunks/" in c[1]]
    assert len(chunk_stats) == 1, "a committed chunk's size is read once"
    # Asked by path: only those, journaled or not.
    asked = reader.report([str(data / "elsewhere"), paths[0]])
    assert [(s.path, s.journaled) for s in asked.snapshots] == [(str(data / "elsewhere"), False), (paths[0], True)]


def test_finished_snapshots_leave_the_journal_before_the_dispatcher_replays_it(tmp_path: Path) -> None:
    """TensorFlow restores every journaled snapshot among those it hands the workers, a finished one
    counted as holding no stream for good: one that sorts first starves every snapshot saved after
    the restart (tests/e2e/test_snapshot_lifecycle.py saw it). Its records go; the rest stay byte
    for byte, and the readers of the journal start over from the rewritten files."""
    work_dir, data = tmp_path / "work", tmp_path / "data"
    directory = work_dir / JOURNAL_DIR
    directory.mkdir(parents=True)
    update = update_class()
    done, writing, gone, deleted = (str(data / n) for n in ("done", "writing", "gone", "deleted"))
    write_snapshot(data / "done", {"chunk_0_0_10": 10}, {"stream_0": True}, final="DONE")
    write_snapshot(data / "writing", {}, {"stream_0": False})
    write_snapshot(data / "deleted", {}, {}, final="ERROR")
    (data / "deleted" / snapshots.DELETED_FILE).write_bytes(b"")
    first = [
        journal_record(update(acquire={"client": 1})),
        journal_record(update(snapshot={"path": done})),
        journal_record(update(snapshot={"path": writing})),
        journal_record(update(snapshot={"path": gone})),
    ]
    second = [journal_record(update(snapshot={"path": deleted})), journal_record(update(release={"client": 1}))]
    third = [journal_record(update(acquire={"client": 2}))]
    for name, records in (("journal_0", first), ("journal_1", second), ("journal_2", third)):
        (directory / name).write_bytes(b"".join(records))
    untouched = (directory / "journal_2").stat().st_mtime_ns
    fs = LocalFileSystem()
    clients = JournalClients(str(work_dir))
    reader = SnapshotReader(fs, str(work_dir), str(data))
    assert clients.attached() == 1
    assert [s.path for s in reader.report().snapshots] == [done, writing, gone, deleted]

    dropped = forget_finished_snapshots(fs, str(directory), lambda path: tffiles.snapshot_finished(fs, path))

    assert dropped == [(done, "completed"), (gone, "its path is gone"), (deleted, "its data was deleted")]
    assert (directory / "journal_0").read_bytes() == first[0] + first[2]
    assert (directory / "journal_1").read_bytes() == second[1]
    assert (directory / "journal_2").stat().st_mtime_ns == untouched, "a file with nothing to drop is not rewritten"
    assert sorted(p.name for p in directory.iterdir()) == ["journal_0", "journal_1", "journal_2"]
    assert clients.attached() == 1, "the clients are counted again from the first update"
    reader = SnapshotReader(fs, str(work_dir), str(data))
    assert [s.path for s in reader.report().snapshots] == [writing]
    assert forget_finished_snapshots(fs, str(directory), lambda path: tffiles.snapshot_finished(fs, path)) == []


def test_a_journal_tail_reads_everything_again_from_a_file_rewritten_shorter(tmp_path: Path) -> None:
    directory = tmp_path / JOURNAL_DIR
    directory.mkdir()
    update = update_class()
    records = [journal_record(update(acquire={"client": n})) for n in range(3)]
    (directory / "journal_0").write_bytes(b"".join(records))
    tail = JournalTail(LocalFileSystem(), str(directory))
    assert [u.acquire.client for u in tail.read()] == [0, 1, 2] and not tail.rewound
    assert tail.read() == [] and not tail.rewound
    (directory / "journal_0").write_bytes(records[0] + records[2])
    assert [u.acquire.client for u in tail.read()] == [0, 2] and tail.rewound
    assert tail.read() == [] and not tail.rewound


def test_a_dispatcher_without_a_journal_says_why_it_lists_nothing(tmp_path: Path) -> None:
    report = SnapshotReader(LocalFileSystem(), None, None).report()
    assert report.snapshots == () and "not fault tolerant" in report.journal


def test_the_routes_answer_the_query_and_forward_it(tmp_path: Path) -> None:
    reader = SnapshotReader(LocalFileSystem(), str(tmp_path), str(tmp_path))
    bad = reader.route("paths=/x")
    assert bad.status == 400 and b"unknown query parameters" in bad.body
    good = reader.route("path=" + str(tmp_path / "none"))
    assert good.status == 200 and good.content_type == "application/json"
    assert SnapshotsReport.from_json(good.body).snapshots[0].state == snapshots.MISSING

    state = probestate.ProbeState("dispatcher starting")
    route = proxy_route(state, timeout=5)
    waiting = route("")
    assert waiting.status == 503 and b"not known yet: starting" in waiting.body
    inner = health.HealthServer(
        probestate.ProbeState("snapshots"), 0, host="127.0.0.1", query_routes={snapshots.SNAPSHOTS_PATH: reader.route}
    )
    inner.start()
    try:
        state.apply(probestate.status_line(probestate.RUNNING, True, "serving", snapshots_port=inner.port))
        forwarded = route("path=" + str(tmp_path / "none"))
        assert forwarded.status == 200 and forwarded.content_type == "application/json", forwarded
        assert SnapshotsReport.from_json(forwarded.body).snapshots[0].path == str(tmp_path / "none")
        refused = route("bogus=1")
        assert refused.status == 400 and b"unknown query parameters: bogus" in refused.body
    finally:
        inner.stop()
    gone = route("")
    assert gone.status == 503 and b"did not answer" in gone.body
    with pytest.raises(ValueError, match="malformed snapshots_port"):
        state.apply(probestate.status_line(probestate.RUNNING, True, "serving", snapshots_port=70000))


ENVIRON = {
    "TFDATA_SERVICE_ADDRESS": "grpc://imagenet-dispatcher.ml.svc:5050",
    "TFDATA_SHARDING_POLICY": "DYNAMIC",
    "TFDATA_SERVICE_NAME": "imagenet",
    "TFDATA_REPORT_URL": "http://imagenet-dispatcher.ml.svc:8080/v1/client-report",
}


def test_the_client_finds_the_path_and_the_progress_url_from_the_published_settings(tmp_path: Path) -> None:
    empty = str(tmp_path)  # no mounted ConfigMap
    target = client_snapshots.resolve(
        "v3", "imagenet", environ={**ENVIRON, "TFDATA_SNAPSHOT_DIR": "gs://b/snaps/"}, directory=empty
    )
    assert target.path == "gs://b/snaps/v3" and target.address == ENVIRON["TFDATA_SERVICE_ADDRESS"]
    assert target.snapshots_url == "http://imagenet-dispatcher.ml.svc:8080/v1/snapshots"
    published = {**ENVIRON, "TFDATA_SNAPSHOTS_URL": "http://d:1/v1/snapshots", "TFDATA_SNAPSHOT_DIR": "/mnt/s"}
    assert client_snapshots.resolve("v3", environ=published, directory=empty).snapshots_url == "http://d:1/v1/snapshots"
    assert client_snapshots.resolve("v3", environ=published, directory=empty, snapshot_dir="/x").path == "/x/v3"
    # No settings at all: the directory alone is enough to load.
    alone = client_snapshots.resolve("v3", environ={"TFDATA_SNAPSHOT_DIR": "/mnt/s"}, directory=empty)
    assert (alone.path, alone.address, alone.snapshots_url) == ("/mnt/s/v3", None, None)
    with pytest.raises(client_snapshots.SnapshotError, match="no snapshot directory: pass snapshot_dir= or set"):
        client_snapshots.resolve("v3", environ=ENVIRON, directory=empty)
    with pytest.raises(client_snapshots.SnapshotError, match="a snapshot name must match"):
        client_snapshots.resolve("../v3", environ=published, directory=empty)
    with pytest.raises(client_snapshots.SnapshotError, match="no snapshot progress URL"):
        client_snapshots.wait("v3", environ={"TFDATA_SNAPSHOT_DIR": "/mnt/s"}, directory=empty)
    assert discovery.KEYS["snapshot_dir"] == client_snapshots.SNAPSHOT_DIR_ENV == "TFDATA_SNAPSHOT_DIR"


def serve_states(states: list[SnapshotProgress]) -> health.HealthServer:
    """A dispatcher's /v1/snapshots that answers each reading in turn, the last one from then on."""

    def answer(query: str) -> probestate.Reply:
        progress = states.pop(0) if len(states) > 1 else states[0]
        return probestate.Reply(200, SnapshotsReport((progress,), "j").to_json().encode(), "application/json")

    server = health.HealthServer(
        probestate.ProbeState("x"), 0, host="127.0.0.1", query_routes={snapshots.SNAPSHOTS_PATH: answer}
    )
    server.start()
    return server


def test_wait_returns_when_completed_raises_on_failed_and_gives_up_at_its_timeout() -> None:
    path = "/mnt/s/v3"
    environ = {"TFDATA_SNAPSHOT_DIR": "/mnt/s"}
    running = SnapshotProgress(path, snapshots.IN_PROGRESS, True, 2, 1, 1, 10, 100)
    cases: list[tuple[list[SnapshotProgress], Any]] = [
        ([SnapshotProgress(path, snapshots.MISSING), running, SnapshotProgress(path, "COMPLETED", True, 2, 2)], None),
        ([running, SnapshotProgress(path, snapshots.FAILED, True, error="INVALID_ARGUMENT: boom")], "boom"),
        ([running], "not completed after 0.3s: snapshot /mnt/s/v3 in progress: 1/2 streams done"),
    ]
    for states, raises in cases:
        server = serve_states(list(states))
        url = f"http://127.0.0.1:{server.port}{snapshots.SNAPSHOTS_PATH}"
        seen: list[SnapshotProgress] = []
        try:
            kwargs: dict[str, Any] = {"snapshots_url": url, "environ": environ, "progress": seen.append}
            if raises is None:
                done = client_snapshots.wait("v3", timeout=10, poll_seconds=0.01, **kwargs)
                assert done.state == snapshots.COMPLETED and [s.state for s in seen] == [
                    "MISSING",
                    "IN_PROGRESS",
                    "COMPLETED",
                ]
            else:
                error = (
                    client_snapshots.SnapshotFailedError if raises == "boom" else client_snapshots.SnapshotTimeoutError
                )
                with pytest.raises(error, match=raises):
                    client_snapshots.wait("v3", timeout=0.3, poll_seconds=0.05, **kwargs)
        finally:
            server.stop()
    # A dispatcher that does not answer is waited for, and named when the wait gives up.
    with pytest.raises(client_snapshots.SnapshotTimeoutError, match="did not answer") as gave_up:
        client_snapshots.wait("v3", timeout=0.2, poll_seconds=0.05, snapshots_url=url, environ=environ)
    assert gave_up.value.progress is None


# --- deleting a snapshot's data ------------------------------------------------------------------

# What TensorFlow 2.21 left at the path of a snapshot that completed (one worker).
COMPLETED_NAMES = [
    "DONE",
    "chunks/",
    "dataset_def.proto",
    "dataset_spec.pb",
    "prefetched_splits/",
    "snapshot.metadata",
    "streams/",
]


def test_deletion_keeps_what_tensorflows_resume_reads_for_a_journaled_snapshot_and_refuses_one_being_written() -> None:
    plan = snapshots.plan_deletion(COMPLETED_NAMES, journaled=True)
    assert plan.refused is None and plan.state_before == snapshots.COMPLETED and not plan.remove_all
    # The data goes, DONE last (ERROR replaces it first); the small files stay.
    assert plan.remove == ("chunks", "prefetched_splits", "streams", "DONE"), plan
    assert plan.keep == ("DELETED", "ERROR", "dataset_def.proto", "dataset_spec.pb", "snapshot.metadata"), plan
    assert plan.write_marker and plan.write_error
    failed = snapshots.plan_deletion([n for n in COMPLETED_NAMES if n != "DONE"] + ["ERROR"], journaled=True)
    assert failed.state_before == snapshots.FAILED and not failed.write_error, "TensorFlow's own ERROR is kept"
    assert "ERROR" in failed.keep and "ERROR" not in failed.remove
    # Done again (a DELETE cut short, or a second one): the rest goes, nothing is written twice.
    again = snapshots.plan_deletion(["DELETED", "ERROR", "DONE", "snapshot.metadata", "streams/"], journaled=True)
    assert again.state_before == snapshots.DELETED and again.remove == ("streams", "DONE"), again
    assert not again.write_marker and not again.write_error
    done = snapshots.plan_deletion(["DELETED", "ERROR", "snapshot.metadata"], journaled=True)
    assert done.remove == () and done.refused is None
    # Not journaled here: the whole path, whatever it finished as.
    for names in (COMPLETED_NAMES, ["DELETED", "ERROR", "snapshot.metadata"]):
        whole = snapshots.plan_deletion(names, journaled=False)
        assert whole.remove_all and whole.refused is None and not whole.write_error, whole
    assert snapshots.plan_deletion(None, journaled=True) == snapshots.DeletionPlan(snapshots.MISSING, True)
    for names, state, why in [
        (["snapshot.metadata", "chunks/", "streams/"], snapshots.IN_PROGRESS, "TensorFlow cannot cancel one"),
        (["chunks/", "DONE"], snapshots.UNKNOWN, "no snapshot.metadata"),
        (["etc/", "home/"], snapshots.UNKNOWN, "holds no tf.data distributed snapshot"),
    ]:
        for journaled in (True, False):
            refused = snapshots.plan_deletion(names, journaled)
            assert refused.state_before == state and why in (refused.refused or ""), refused
            assert refused.remove == () and not refused.remove_all and not refused.write_marker


@pytest.mark.parametrize("journaled", [True, False])
def test_deletion_refuses_a_path_that_holds_more_than_a_snapshots_own_files(journaled: bool) -> None:
    # What TensorFlow writes there, an atomic write cut short included, is deleted.
    written = [*COMPLETED_NAMES, "ERROR", "DELETED", "DONE__host-1a-7-5f3e.tmp", "snapshot.metadata__h-2-3-4.tmp"]
    assert snapshots.plan_deletion(written, journaled).refused is None
    assert set(snapshots.LAYOUT_NAMES) >= {n.rstrip("/") for n in COMPLETED_NAMES}
    # A dispatcher's work directory inside the snapshot directory, snapshot.metadata and DONE planted in it.
    planted = ["snapshot.metadata", "DONE", "tf_data_dispatcher_journal/", "tfdata-owner"]
    refused = snapshots.plan_deletion(planted, journaled)
    assert refused.state_before == snapshots.COMPLETED and refused.remove == () and not refused.remove_all
    assert not refused.write_marker and not refused.write_error, refused
    said = refused.refused or ""
    assert "no tf.data snapshot writes there: tf_data_dispatcher_journal, tfdata-owner" in said, said
    assert "nothing is deleted" in said and "a dispatcher.workDir lies inside the snapshot directory" in said
    for extra in ("3-workers-g2/", "home", ".bashrc", "notes.tmp", "journal__x.tmp", "DONE__x", "DONE.tmp"):
        refused = snapshots.plan_deletion([*COMPLETED_NAMES, extra], journaled)
        assert f"writes there: {extra.rstrip('/')}." in (refused.refused or ""), (extra, refused)
        assert "workDir" not in (refused.refused or "") and refused.remove == (), refused
    many = snapshots.plan_deletion([*COMPLETED_NAMES, *(f"x{i}" for i in range(20))], journaled)
    assert "x15 and 12 more." in (many.refused or ""), many


def test_a_journal_inside_the_snapshot_directory_is_never_deleted(tmp_path: Path) -> None:
    """The audit's case: the dispatcher's workDir is ``<snapshot directory>/<name>``, and whoever can
    write there plants a finished snapshot's files beside the journal."""
    data = tmp_path / "snaps"
    work = data / "journal"
    (work / JOURNAL_DIR).mkdir(parents=True)
    (work / JOURNAL_DIR / "journal_0").write_bytes(b"")
    (work / "tfdata-owner").write_text("ml/b\n")
    (work / "snapshot.metadata").write_text('element_spec: "x"\n')
    (work / "DONE").write_bytes(b"")
    before = tree(work)
    reader = SnapshotReader(LocalFileSystem(), str(work), str(data))
    route = reader.delete_route(urllib.parse.urlencode({"path": str(work)}))
    answer = snapshots.SnapshotDeletion.from_json(route.body)
    assert route.status == 409 and answer.removed == () and "a dispatcher's journal" in answer.detail, route
    assert tree(work) == before, "nothing is touched, no tombstone written"


def test_a_tombstones_files_read_back() -> None:
    error = snapshots.tombstone_error('/data/we"ird\\path')
    assert error.startswith(b"code: NOT_FOUND\nmessage: "), error
    text = snapshots.error_text(error)
    assert text.startswith('NOT_FOUND: the data of the tf.data snapshot at /data/we"ird\\path was deleted'), text
    assert snapshots.marker_state_before(snapshots.deleted_marker(snapshots.FAILED, 5.0)) == snapshots.FAILED
    assert snapshots.marker_state_before(b"not json") is None
    assert snapshots.marker_state_before(b'{"state_before": "IN_PROGRESS"}') is None
    answer = snapshots.SnapshotDeletion("/d/a", snapshots.COMPLETED, True, ("chunks", "DONE"), ("ERROR",), "kept")
    assert snapshots.SnapshotDeletion.from_json(answer.to_json()) == answer
    with pytest.raises(SnapshotsError, match="removed must be a list of strings"):
        snapshots.SnapshotDeletion.from_json(
            '{"path": "/a", "state_before": "MISSING", "journaled": false, "removed": 1}'
        )
    assert snapshots.deletion_path({"path": ["/a"]}) == "/a"
    for query in ({}, {"path": ["/a", "/b"]}):
        with pytest.raises(SnapshotsError, match="a DELETE names exactly one path="):
            snapshots.deletion_path(query)
    assert snapshots.state_from_names(["snapshot.metadata", "ERROR", "DELETED"]) == snapshots.DELETED
    assert SnapshotProgress("/d/a", snapshots.DELETED).final


def journaled_reader(tmp_path: Path, *names: str) -> tuple[SnapshotReader, Path, Clock]:
    work_dir, data = tmp_path / "work", tmp_path / "data"
    journal = work_dir / JOURNAL_DIR / "journal_0"
    journal.parent.mkdir(parents=True)
    journal.write_bytes(b"".join(journal_record(update_class()(snapshot={"path": str(data / n)})) for n in names))
    clock = Clock(100.0)
    reader = SnapshotReader(LocalFileSystem(), str(work_dir), str(data), clock, wall_clock=lambda: 1795772038.0)
    return reader, data, clock


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def deleted(reader: SnapshotReader, path: str) -> tuple[int, snapshots.SnapshotDeletion]:
    return until_ended(lambda: reader.delete(path))


def test_the_reader_deletes_a_journaled_snapshots_data_and_says_deleted_after(tmp_path: Path) -> None:
    reader, data, clock = journaled_reader(tmp_path, "done", "failed", "running")
    done = write_snapshot(data / "done", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    (done / "dataset_def.proto").write_bytes(b"def")
    assert reader.report([str(done)]).snapshots[0].state == snapshots.COMPLETED  # a reading to forget

    # Answered at once, the tombstone's markers written first; the files go in the background.
    status, started = reader.delete(str(done))
    assert (status, started.under_way, started.removed) == (409, True, ()), started
    assert "in the background" in started.detail and (done / "DELETED").exists() and (done / "ERROR").exists()
    status, answer = deleted(reader, str(done))
    assert status == 200 and answer.journaled and answer.state_before == snapshots.COMPLETED, answer
    assert answer.removed == ("chunks", "streams", "DONE") and "journal names the path" in answer.detail, answer
    assert tree(done) == ["DELETED", "ERROR", "dataset_def.proto", "snapshot.metadata"]
    assert answer.kept == ("DELETED", "ERROR", "dataset_def.proto", "snapshot.metadata")
    assert json.loads((done / "DELETED").read_text()) == {"state_before": "COMPLETED", "deleted_at": 1795772038.0}
    # Read at once (no cached COMPLETED), and again later: DELETED, nothing counted.
    for _ in range(2):
        (reading,) = reader.report([str(done)]).snapshots
        assert (reading.state, reading.chunks, reading.bytes, reading.error) == (snapshots.DELETED, 0, 0, None)
        assert "it was COMPLETED" in (reading.detail or "") and reading.finished_at is not None, reading
        clock.now += 61
    # Idempotent: a second DELETE succeeds and removes nothing more.
    status, second = reader.delete(str(done))
    assert (status, second.state_before, second.removed) == (200, snapshots.DELETED, ()), second
    assert tree(done) == ["DELETED", "ERROR", "dataset_def.proto", "snapshot.metadata"]

    failed = write_snapshot(data / "failed", {}, {"stream_0": False}, "ERROR")
    status, answer = deleted(reader, str(failed))
    assert status == 200 and answer.state_before == snapshots.FAILED, answer
    assert tree(failed) == ["DELETED", "ERROR", "snapshot.metadata"] and (failed / "ERROR").read_bytes() == ERROR_FILE

    running = write_snapshot(data / "running", {"chunk_0_0_10": 50}, {"stream_0": False})
    before = tree(running)
    route = reader.delete_route("path=" + str(running))
    refused = snapshots.SnapshotDeletion.from_json(route.body)
    assert route.status == 409 and refused.state_before == snapshots.IN_PROGRESS, route
    assert "TensorFlow cannot cancel one" in refused.detail and refused.removed == ()
    assert tree(running) == before, "nothing is touched"


def test_the_reader_removes_a_snapshot_its_journal_does_not_name_and_refuses_what_is_no_snapshot(
    tmp_path: Path,
) -> None:
    reader, data, _ = journaled_reader(tmp_path, "journaled-gone")
    other = write_snapshot(data / "other", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    status, answer = deleted(reader, str(other))
    assert (status, answer.journaled, answer.state_before) == (200, False, snapshots.COMPLETED), answer
    assert answer.removed == ("DONE", "chunks", "snapshot.metadata", "streams") and not other.exists()
    assert reader.report([str(other)]).snapshots[0].state == snapshots.MISSING
    # Nothing there: 200, nothing removed; when journaled, the answer warns.
    status, again = reader.delete(str(other))
    assert (status, again.state_before, again.removed) == (200, snapshots.MISSING, ()), again
    status, gone = reader.delete(str(data / "journaled-gone"))
    assert status == 200 and gone.journaled and "its next start fails" in gone.detail, gone
    (data / "plain" / "keep").mkdir(parents=True)
    status, plain = reader.delete(str(data / "plain"))
    assert (status, plain.state_before) == (409, snapshots.UNKNOWN) and (data / "plain" / "keep").exists()
    assert reader.delete_route("").status == 400 and reader.delete_route("path=/a&path=/b").status == 400


def test_delete_is_forwarded_to_the_tensorflow_process(tmp_path: Path) -> None:
    reader, data, _ = journaled_reader(tmp_path, "done")
    done = write_snapshot(data / "done", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    inner = health.HealthServer(
        probestate.ProbeState("snapshots"),
        0,
        host="127.0.0.1",
        query_routes={snapshots.SNAPSHOTS_PATH: reader.route},
        delete_routes={snapshots.SNAPSHOTS_PATH: reader.delete_route},
    )
    inner.start()
    state = probestate.ProbeState("dispatcher")
    outer = health.HealthServer(
        state,
        0,
        host="127.0.0.1",
        query_routes={snapshots.SNAPSHOTS_PATH: proxy_route(state, timeout=5)},
        delete_routes={snapshots.SNAPSHOTS_PATH: proxy_route(state, timeout=5, method="DELETE")},
    )
    outer.start()
    try:
        state.apply(probestate.status_line(probestate.RUNNING, True, "serving", snapshots_port=inner.port))
        url = f"http://127.0.0.1:{outer.port}{snapshots.SNAPSHOTS_PATH}?path={done}"
        with pytest.raises(urllib.error.HTTPError) as started:  # 409 under_way: the files go in the background
            urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10)
        assert started.value.code == 409 and snapshots.SnapshotDeletion.from_json(started.value.read()).under_way
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10) as response:
                    answer = snapshots.SnapshotDeletion.from_json(response.read())
                break
            except urllib.error.HTTPError as exc:
                said = exc.read()
                assert exc.code == 409 and time.monotonic() < deadline, (exc.code, said)
                time.sleep(0.01)
        assert answer.state_before == snapshots.COMPLETED and "DONE" in answer.removed, answer
        assert client_snapshots.read_report(url.partition("?")[0], (str(done),)).snapshots[0].state == "DELETED"
        with pytest.raises(urllib.error.HTTPError) as elsewhere:
            urllib.request.urlopen(urllib.request.Request(url.replace("snapshots", "signals"), method="DELETE"))
        assert elsewhere.value.code == 404 and b"DELETE goes to /v1/snapshots" in elsewhere.value.read()
    finally:
        outer.stop()
        inner.stop()


def test_wait_says_a_deleted_snapshot_was_deleted() -> None:
    server = serve_states([SnapshotProgress("/mnt/s/v3", snapshots.DELETED, True)])
    try:
        with pytest.raises(client_snapshots.SnapshotDeletedError, match="was deleted: its data is gone"):
            client_snapshots.wait(
                "v3",
                timeout=5,
                poll_seconds=0.01,
                snapshots_url=f"http://127.0.0.1:{server.port}{snapshots.SNAPSHOTS_PATH}",
                environ={"TFDATA_SNAPSHOT_DIR": "/mnt/s"},
            )
    finally:
        server.stop()


class ReadOnlyFileSystem(LocalFileSystem):
    """A store that lists but refuses writes (root writes anywhere on this machine's own disk)."""

    def write(self, path: str, data: bytes) -> None:
        raise PermissionError(13, "Permission denied", path)


def test_a_missing_path_says_whether_the_servers_could_write_there_and_leaves_no_file(tmp_path: Path) -> None:
    directory = str(tmp_path / "not" / "yet")
    path = f"{directory}/snap"
    writable = SnapshotReader(LocalFileSystem(), None, directory).report([path]).snapshots[0]
    assert (writable.state, writable.writable, writable.detail) == (snapshots.MISSING, True, None)
    assert [p.name for p in tmp_path.iterdir()] == []  # the probe went, and nothing was created
    refused = SnapshotReader(ReadOnlyFileSystem(), None, directory).report([path]).snapshots[0]
    assert refused.state == snapshots.MISSING and refused.writable is False
    assert (refused.detail or "").startswith(f"cannot write in {tmp_path}: PermissionError"), refused
    round_trip = snapshots.SnapshotsReport.from_json(snapshots.SnapshotsReport((refused,), "j").to_json())
    assert round_trip.snapshots[0] == refused


@pytest.mark.parametrize("directory", ["/mnt/snaps", "/mnt/snaps/", "gs://bucket/snaps"])
def test_only_one_name_directly_in_the_snapshot_directory_is_served(directory: str) -> None:
    base = directory.rstrip("/")
    for name in ("v3", "_v3", "a.b-c_9", "x" * snapshots.MAX_NAME_LENGTH):
        assert snapshots.confined(f"{base}/{name}", directory) == f"{base}/{name}"
    for path in (
        f"{base}/..",
        f"{base}/.",
        f"{base}/",
        base,
        f"{base}//v3",
        f"{base}/./v3",
        f"{base}/../v3",
        f"{base}/a/b",
        f"{base}/v3/",
        f"{base}/v3/chunks",
        f"{base}/.hidden",
        f"{base}/-v3",
        f"{base}/v3\n",
        f"{base}/" + "x" * (snapshots.MAX_NAME_LENGTH + 1),
        f"{base}-other/v3",  # a longer directory that starts with the same letters
        "/etc/passwd",
        "gs://other-bucket/snaps/v3",
    ):
        said = f"serves only {base}/<name>, one name directly in {directory}"
        with pytest.raises(snapshots.PathRefused, match=re.escape(said)):
            snapshots.confined(path, directory)
    with pytest.raises(snapshots.PathRefused, match=r"no snapshot directory .*no spec\.snapshots"):
        snapshots.confined(f"{base}/v3", None)
    assert issubclass(snapshots.PathRefused, SnapshotsError)


def test_the_dispatcher_takes_every_name_a_tfdatasnapshot_takes() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "tfdata.dev_tfdatasnapshots.yaml").read_text())
    name = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["snapshotName"]
    assert (name["pattern"], name["maxLength"]) == (f"^{snapshots.SNAPSHOT_NAME.pattern}$", snapshots.MAX_NAME_LENGTH)
    assert client_snapshots.NAME.pattern.startswith("[A-Za-z0-9]")  # the trainers' names are a part of these


class RecordingFileSystem(LocalFileSystem):
    """Every write asked of it, in ``writes``."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, path: str, data: bytes) -> None:
        self.writes.append(path)
        super().write(path, data)


def test_the_reader_deletes_and_checks_only_in_its_snapshot_directory(tmp_path: Path) -> None:
    work_dir, data = tmp_path / "work", tmp_path / "data"
    elsewhere = str(data / ".." / "journaled-elsewhere")  # journaled: a trainer may save anywhere
    journal = work_dir / JOURNAL_DIR / "journal_0"
    journal.parent.mkdir(parents=True)
    journal.write_bytes(journal_record(update_class()(snapshot={"path": elsewhere})))
    write_snapshot(tmp_path / "journaled-elsewhere", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    other = write_snapshot(tmp_path / "other-service" / "train-v1", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    (data / "mine").mkdir(parents=True)
    fs = RecordingFileSystem()
    reader = SnapshotReader(fs, str(work_dir), str(data))
    before = tree(tmp_path)

    for path in (str(other), str(data / ".." / "other-service" / "train-v1"), elsewhere, str(data), "gs://b/x"):
        route = reader.delete_route(urllib.parse.urlencode({"path": path}))
        assert route.status == 403 and f"serves only {data}/<name>".encode() in route.body, (path, route)
    # Asked for, a path elsewhere is refused before anything is read or written (no write check).
    refused = reader.route(urllib.parse.urlencode({"path": str(tmp_path / "not-yet" / "x")}))
    assert refused.status == 403 and f"one name directly in {data}".encode() in refused.body, refused
    assert tree(tmp_path) == before and fs.writes == []
    # What the journal names is still read, asked for or not, and a path in the directory is checked.
    assert [(s.path, s.state) for s in reader.report().snapshots] == [(elsewhere, snapshots.COMPLETED)]
    assert reader.report([elsewhere]).snapshots[0].state == snapshots.COMPLETED
    (missing,) = reader.report([str(data / "next")]).snapshots
    assert (missing.state, missing.writable) == (snapshots.MISSING, True) and fs.writes[0].startswith(f"{data}/")

    # A service without spec.snapshots deletes nothing and checks nothing; its journal is still listed.
    bare = SnapshotReader(fs, str(work_dir), None)
    for route in (bare.delete_route(f"path={data}/mine"), bare.route(f"path={data}/mine")):
        assert route.status == 403 and b"no snapshot directory" in route.body, route
    assert [s.path for s in bare.report().snapshots] == [elsewhere]
    assert (data / "mine").is_dir() and other.is_dir()


SECRET = "TFDATA_TOKEN=not-for-trainers"


def test_a_symbolic_link_in_a_snapshot_is_never_followed(tmp_path: Path) -> None:
    """A trainer on the snapshot volume plants links: nothing is read, written or deleted through one."""
    cases = {  # snapshot name -> (the link under it, where it points)
        "root": ("", "real"),
        "chunks": ("chunks", "precious"),
        "streams": ("streams", "precious"),
        "deep": ("streams/stream_0/checkpoints", "precious"),
        "error": ("ERROR", "secret"),
        "done": ("DONE", "secret"),
        "deleted": ("DELETED", "secret"),
        "chunk": ("chunks/chunk_0_0_10", "secret"),
    }
    reader, data, _ = journaled_reader(tmp_path, "chunks", "streams", "error", "done", "deleted", "chunk")
    (tmp_path / "secret").write_text(SECRET)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "journal_0").write_text("keep me")
    write_snapshot(tmp_path / "real", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    data.mkdir()
    for name, (link, target) in cases.items():
        if link:  # a snapshot as TensorFlow writes it, then the link in place of what was there
            root = write_snapshot(data / name, {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
            if (root / link).is_dir():
                shutil.rmtree(root / link)
            (root / link).unlink(missing_ok=True)
            (root / link).parent.mkdir(parents=True, exist_ok=True)
        (data / name / link if link else data / name).symlink_to(tmp_path / target)
    outside = {p: p.read_bytes() for p in [tmp_path / "secret", *(tmp_path / "precious").rglob("*")]}
    real = tree(tmp_path / "real")
    for name, (link, _) in cases.items():
        path, before = str(data / name), tree(data / name) if link else []
        got = reader.route(urllib.parse.urlencode({"path": path}))
        assert got.status == 200 and SECRET.encode() not in got.body, (name, got)
        (reading,) = SnapshotsReport.from_json(got.body).snapshots
        if name != "deep":  # read where the link is: the snapshot is not read
            assert reading.state == snapshots.UNKNOWN, (name, reading)
            assert f"a symbolic link was found: {data / name / link if link else path}" in (reading.detail or "")
        status, answer = reader.delete(path)
        assert status == 409 and answer.removed == (), (name, answer)
        assert f"{data / name / link if link else path} is a symbolic link" in answer.detail, (name, answer)
        assert "nothing was deleted" in answer.detail and SECRET not in answer.to_json()
        assert (tree(data / name) if link else []) == before, f"{name}: nothing is touched, no marker written"
    assert {p: p.read_bytes() for p in outside} == outside and tree(tmp_path / "real") == real


def test_a_snapshots_file_that_is_no_regular_file_is_not_waited_for(tmp_path: Path) -> None:
    reader, data, _ = journaled_reader(tmp_path, "fifo")
    os.mkfifo(write_snapshot(data / "fifo", {}, {"stream_0": False}) / "ERROR")  # no writer will ever open it
    answers: list[Any] = []
    reading = threading.Thread(target=lambda: answers.append(reader.report([str(data / "fifo")])), daemon=True)
    reading.start()
    reading.join(10)
    assert not reading.is_alive(), "a reading of a FIFO waits for its writer for good"
    (progress,) = answers[0].snapshots
    assert progress.state == snapshots.UNKNOWN and "not a regular file" in (progress.detail or ""), progress


def test_a_removal_takes_a_link_planted_after_the_check_as_a_link(tmp_path: Path) -> None:
    """What a DELETE removes is removed relative to the directory above it: a link that appears
    between the check and the removal goes as a link, and its target stays."""
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "journal_0").write_text("keep me")
    top = write_snapshot(tmp_path / "s", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    files = NoFollowFileSystem(str(top))
    assert files.symlinks(str(top)) == []
    (top / "streams" / "stream_0" / "later").symlink_to(tmp_path / "precious")
    files.remove_tree(str(top))
    assert not top.exists() and (tmp_path / "precious" / "journal_0").read_text() == "keep me"
    with pytest.raises(ValueError, match="is not below"):
        files.listdir(f"{top}/../precious")


class HeldFileSystem(NoFollowFileSystem):
    """A store whose listing of ``held`` (a reading) or removal below it (a DELETE) waits for
    ``release``; ``entered`` is set once one waits. Every listing of ``held`` and every removal is
    counted in ``calls``."""

    def __init__(self, top: str, held: str, entered: threading.Event, release: threading.Event, calls: list[str]):
        super().__init__(top)
        self.held, self.entered, self.release, self.calls = held, entered, release, calls

    def _wait(self, what: str) -> None:
        self.calls.append(what)
        self.entered.set()
        assert self.release.wait(30), "the test never let the store go on"

    def listdir(self, path: str) -> list[str]:
        if path == self.held and self.held.endswith("/slow"):
            self._wait(f"listdir {path}")
        return super().listdir(path)

    def remove_tree(self, path: str) -> None:
        if path.startswith(self.held) and self.held.endswith("/removed"):
            self._wait(f"remove {path}")
        super().remove_tree(path)


def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def test_a_slow_store_for_one_path_delays_no_other_path_and_missing_names_cost_one_write_check(
    tmp_path: Path,
) -> None:
    """A trainer that asks for a path on a store that hangs, and 64 new names a request, holds up
    neither the operator's read of another path nor the store (one write check, not 64)."""
    data = tmp_path / "data"
    slow = write_snapshot(data / "slow", {"chunk_0_0_10": 5}, {"stream_0": True}, "DONE")
    other = write_snapshot(data / "other", {"chunk_0_0_10": 5}, {"stream_0": True}, "DONE")
    entered, release, calls = threading.Event(), threading.Event(), list[str]()
    fs = RecordingFileSystem()
    reader = SnapshotReader(
        fs, None, str(data), local_files=lambda top: HeldFileSystem(top, str(slow), entered, release, calls)
    )
    try:
        held, held_answers = in_thread(lambda: reader.report([str(slow)]))
        assert entered.wait(10), "the reading of the slow path never reached the store"
        shared, shared_answers = in_thread(lambda: reader.report([str(slow)]))  # waits for the same reading
        started = time.monotonic()
        quick, quick_answers = in_thread(lambda: reader.report([str(other)]))
        quick.join(2.0)
        took = time.monotonic() - started
        assert not quick.is_alive(), f"the other path waited on the slow one ({took:.2f}s and counting)"
        assert quick_answers[0].snapshots[0].state == snapshots.COMPLETED and took < 2.0, took
        new = [str(data / f"new-{i}") for i in range(snapshots.MAX_PATHS)]
        route = reader.route(urllib.parse.urlencode({"path": new}, doseq=True))
        readings = SnapshotsReport.from_json(route.body).snapshots
        assert route.status == 200 and {(s.state, s.writable) for s in readings} == {(snapshots.MISSING, True)}
        assert len(fs.writes) == 1, f"one write check for {len(new)} missing names, not {len(fs.writes)}"
        assert held.is_alive() and shared.is_alive(), "the slow path's readers wait for the store"
    finally:
        release.set()
    for thread in (held, shared):
        thread.join(10)
    assert [a.snapshots[0].state for a in held_answers + shared_answers] == [snapshots.COMPLETED] * 2
    assert calls == [f"listdir {slow}"], "two requests for one path in a burst share one reading"


def test_a_delete_answers_at_once_and_a_second_while_the_files_go_starts_nothing(tmp_path: Path) -> None:
    """The removal waits on the store: the DELETE answers at once (409, ``under_way``; no operator
    worker waits for a removal), the operator's next try 15 s later is told it is still under way
    and starts nothing, and once the files are gone, the next answers 200 with what went."""
    reader, data, _ = journaled_reader(tmp_path, "removed")
    removed = write_snapshot(data / "removed", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    entered, release, calls = threading.Event(), threading.Event(), list[str]()
    reader._local_files = lambda top: HeldFileSystem(top, str(removed), entered, release, calls)
    try:
        started = time.monotonic()
        status, first = reader.delete(str(removed))
        took = time.monotonic() - started
        assert (status, first.under_way, first.state_before) == (409, True, snapshots.COMPLETED), first
        assert took < 2.0 and "ask again later" in first.detail, (took, first)
        assert entered.wait(10), "the removal never reached the store"
        route = reader.delete_route(urllib.parse.urlencode({"path": str(removed)}))
        again = snapshots.SnapshotDeletion.from_json(route.body)
        assert route.status == 409 and again.under_way and again.removed == (), route
        assert (again.state_before, again.journaled) == (snapshots.COMPLETED, True), again
        assert "is still removing its files" in again.detail and "ask again later" in again.detail, again
        assert len(calls) == 1, calls
        # Reading goes on meanwhile.
        assert reader.report([str(removed)]).snapshots[0].state == snapshots.DELETED
    finally:
        release.set()
    status, after = deleted(reader, str(removed))
    assert (status, after.under_way, after.removed) == (200, False, ("chunks", "streams", "DONE")), after
    assert tree(removed) == ["DELETED", "ERROR", "snapshot.metadata"]
    status, twice = reader.delete(str(removed))  # deleting twice succeeds, removing nothing more
    assert (status, twice.under_way, twice.removed) == (200, False, ()), twice
    assert snapshots.SnapshotDeletion.from_json(again.to_json()) == again
    with pytest.raises(SnapshotsError, match="under_way must be true or false"):
        snapshots.SnapshotDeletion.from_json(
            '{"path": "/a", "state_before": "MISSING", "journaled": false, "under_way": 1}'
        )


class BlockedFileSystem(NoFollowFileSystem):
    """A store every removal of which waits for ``release``, each counted in ``removing``."""

    def __init__(self, top: str, release: threading.Event, removing: list[str]) -> None:
        super().__init__(top)
        self.release, self.removing = release, removing

    def remove_tree(self, path: str) -> None:
        self.removing.append(path)
        assert self.release.wait(30), "the test never let the store go on"
        super().remove_tree(path)


def test_a_dispatcher_removes_at_most_two_snapshots_at_once_and_asks_the_third_to_wait(tmp_path: Path) -> None:
    reader, data, _ = journaled_reader(tmp_path)
    paths = [write_snapshot(data / n, {"chunk_0_0_10": 5}, {"stream_0": True}, "DONE") for n in ("a", "b", "c")]
    release, removing, third = threading.Event(), list[str](), tree(paths[2])
    reader._local_files = lambda top: BlockedFileSystem(top, release, removing)
    try:
        for path in paths[:2]:
            status, answer = reader.delete(str(path))
            assert (status, answer.under_way) == (409, True), answer
        route = reader.delete_route(urllib.parse.urlencode({"path": str(paths[2])}))
        busy = snapshots.SnapshotDeletion.from_json(route.body)
        assert route.status == 503 and busy.under_way and "nothing was started" in busy.detail, route
        assert "removing the files of 2 other snapshots" in busy.detail, busy
        assert tree(paths[2]) == third, "nothing of the third is touched"
        deadline = time.monotonic() + 10
        while len(removing) < 2:
            assert time.monotonic() < deadline, removing
            time.sleep(0.01)
        assert sorted(removing) == [str(paths[0]), str(paths[1])], removing
    finally:
        release.set()
    for path in paths:  # the third once the others are done
        status, answer = deleted(reader, str(path))
        assert (status, answer.removed) == (200, ("DONE", "chunks", "snapshot.metadata", "streams")), answer
        assert not path.exists()


class FailingFileSystem(NoFollowFileSystem):
    """A store that records each write and removal, and fails the first removal of ``fails``."""

    def __init__(self, top: str, fails: str, done: list[str]) -> None:
        super().__init__(top)
        self.fails, self.done = fails, done

    def write(self, path: str, data: bytes) -> None:
        self.done.append(f"write {path.rsplit('/', 1)[1]}")
        super().write(path, data)

    def remove_tree(self, path: str) -> None:
        self.done.append(f"remove {path.rsplit('/', 1)[1]}")
        if path.endswith(self.fails) and self.done.count(self.done[-1]) == 1:
            raise PermissionError(13, "Permission denied", path)
        super().remove_tree(path)


def test_a_failed_removal_is_said_by_the_next_delete_and_the_one_after_finishes_it(tmp_path: Path) -> None:
    """The order keeps a removal cut short safe: DELETED, then ERROR, before the DELETE answers,
    then the data, DONE last. A store that fails part-way is said by the next DELETE (500, its
    error, as a DELETE that removed before it answered said it); the one after finishes the rest."""
    reader, data, _ = journaled_reader(tmp_path, "done")
    done = write_snapshot(data / "done", {"chunk_0_0_10": 50}, {"stream_0": True}, "DONE")
    steps: list[str] = []
    reader._local_files = lambda top: FailingFileSystem(top, "/streams", steps)
    status, first = reader.delete(str(done))
    assert (status, first.under_way) == (409, True) and steps[:2] == ["write DELETED", "write ERROR"], (first, steps)
    deadline = time.monotonic() + 10
    route = reader.delete_route(urllib.parse.urlencode({"path": str(done)}))
    while route.status == 409:
        assert time.monotonic() < deadline, route
        time.sleep(0.01)
        route = reader.delete_route(urllib.parse.urlencode({"path": str(done)}))
    failed = snapshots.SnapshotDeletion.from_json(route.body)
    assert route.status == 500 and not failed.under_way, route
    assert "removing its files failed: PermissionError: [Errno 13] Permission denied" in failed.detail, failed
    assert steps == ["write DELETED", "write ERROR", "remove chunks", "remove streams"], steps
    assert tree(done)[:3] == ["DELETED", "DONE", "ERROR"] and "streams" in tree(done), "cut short: DONE is kept"
    assert reader.report([str(done)]).snapshots[0].state == snapshots.DELETED
    status, answer = deleted(reader, str(done))  # the next starts it again, and finishes it
    assert (status, answer.removed) == (200, ("streams", "DONE")), answer
    assert steps[4:] == ["remove streams", "remove DONE"], steps
    assert tree(done) == ["DELETED", "ERROR", "snapshot.metadata"]
