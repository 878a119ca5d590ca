"""Deleting a tf.data distributed snapshot's data through the dispatcher pod's ``DELETE /v1/snapshots``,
with real ``tfdata-server`` processes: what is deleted, what is refused, and the dispatcher starting
again on its journal afterwards.

A fault-tolerant dispatcher replays its journal when it starts; TensorFlow fails that start when a
journaled snapshot's path is gone (``SnapshotManager::Resume``), and starves every new snapshot when
a finished one sorts first among those it hands out. The last test restarts the dispatcher on the
same work_dir after a DELETE and a path removed by hand: it starts, forgets the finished snapshots,
serves a new job and writes a snapshot saved after the restart.

Anyone who reaches the health port can ask, so the attacks of the security review are played
against the real dispatcher too: another service's snapshot, a ``chunks`` link into the
dispatcher's own journal, an ``ERROR`` link to a secret file.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from tfdata_operator.client import snapshots as client_snapshots
from tfdata_operator.wire import discovery, serverconfig, snapshots
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

from fixtures.deletion import until_ended
from fixtures.servers import Launch, ServerProcess, free_port

POD_NAME = "127.0.0.1"
WAIT_TIMEOUT = 60.0


@dataclass
class Service:
    launch: Launch
    dispatcher: ServerProcess
    worker: ServerProcess
    snapshot_dir: Path
    env: dict[str, str] | None

    @property
    def environ(self) -> dict[str, str]:
        health = f"http://127.0.0.1:{self.dispatcher.config.health_port}"
        settings = discovery.ClientSettings(
            address=f"grpc://127.0.0.1:{self.dispatcher.config.port}",
            sharding_policy="DYNAMIC",
            processing_mode="DYNAMIC",
            service_name="del",
            snapshots_url=health + snapshots.SNAPSHOTS_PATH,
            snapshot_dir=str(self.snapshot_dir),
        )
        return discovery.to_data(settings)

    def url(self, path: str) -> str:
        query = urllib.parse.urlencode({snapshots.PATH_PARAMETER: path})
        return f"http://127.0.0.1:{self.dispatcher.config.health_port}{snapshots.SNAPSHOTS_PATH}?{query}"

    def ask(self, method: str, path: str) -> tuple[int, bytes]:
        """The status and body of one request, whatever they are."""
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url(path), method=method), timeout=40) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def delete(self, path: str) -> tuple[int, snapshots.SnapshotDeletion]:
        request = urllib.request.Request(self.url(path), method="DELETE")
        try:
            with urllib.request.urlopen(request, timeout=40) as response:
                return response.status, snapshots.SnapshotDeletion.from_json(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, snapshots.SnapshotDeletion.from_json(exc.read())

    def deleted(self, path: str) -> tuple[int, snapshots.SnapshotDeletion]:
        """How the removal a DELETE started ended (``until_ended``)."""
        return until_ended(lambda: self.delete(path), seconds=60.0, pause=0.05)

    def state(self, path: str) -> snapshots.SnapshotProgress:
        return client_snapshots.read_report(self.url(path).partition("?")[0], (path,)).snapshots[0]

    def restart_dispatcher(self) -> ServerProcess:
        assert self.dispatcher.terminate() == 0, self.dispatcher.log()[-3000:]
        self.dispatcher = self.launch(self.dispatcher.config, env=self.env)
        return self.dispatcher


@pytest.fixture(scope="module")
def service(module_launch: Launch, tmp_path_factory: pytest.TempPathFactory) -> Service:
    tmp = tmp_path_factory.mktemp("snapdel")
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
    worker_port = free_port()
    worker = module_launch(
        WorkerServerConfig(
            port=worker_port,
            health_port=free_port(),
            dispatcher_address=f"127.0.0.1:{port}",
            worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{worker_port}",
            heartbeat_interval_ms=300,
        ),
        pod_name=POD_NAME,
        env=env,
    )
    for process in (dispatcher, worker):
        process.wait_probe("/readyz", 200)
    (tmp / "data").mkdir()
    return Service(module_launch, dispatcher, worker, tmp / "data", env)


def dataset(elements: int, sleep_microseconds: int) -> Any:
    from tensorflow.python.data.experimental.ops import testing

    return tf.data.Dataset.range(elements).map(lambda x: x * 3).apply(testing.sleep(sleep_microseconds))


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_snapshot_being_written_is_refused_and_goes_on_to_complete(service: Service) -> None:
    env = service.environ
    path = client_snapshots.save(dataset(60, 30_000), "running", "del", environ=env)  # about 2 s of writing
    status, refused = service.delete(path)
    assert status == 409 and refused.state_before == snapshots.IN_PROGRESS, refused
    assert "TensorFlow cannot cancel one" in refused.detail and refused.removed == (), refused
    done = client_snapshots.wait("running", "del", timeout=WAIT_TIMEOUT, poll_seconds=0.3, environ=env)
    assert (done.state, done.elements) == (snapshots.COMPLETED, 60), (done, service.dispatcher.log()[-3000:])


def test_delete_keeps_a_tombstone_of_a_journaled_snapshot_and_removes_an_unjournaled_one(service: Service) -> None:
    env = service.environ
    path = client_snapshots.save(dataset(40, 0), "kept", "del", environ=env)
    client_snapshots.wait("kept", "del", timeout=WAIT_TIMEOUT, poll_seconds=0.3, environ=env)
    assert client_snapshots.progress("kept", "del", environ=env).state == snapshots.COMPLETED  # a reading to forget

    status, started = service.delete(path)  # answered at once: the files go in the background
    assert (status, started.under_way, started.state_before) == (409, True, snapshots.COMPLETED), started
    status, answer = service.deleted(path)
    assert status == 200 and answer.journaled and answer.state_before == snapshots.COMPLETED, answer
    assert {"chunks", "streams", "DONE"} <= set(answer.removed), answer
    assert answer.kept == ("DELETED", "ERROR", "dataset_def.proto", "dataset_spec.pb", "snapshot.metadata"), answer
    assert tree(Path(path)) == list(answer.kept), "only the tombstone is left"
    reading = service.state(path)
    assert (reading.state, reading.journaled, reading.chunks) == (snapshots.DELETED, True, 0), reading
    with pytest.raises(client_snapshots.SnapshotDeletedError, match="was deleted"):
        client_snapshots.load("kept", "del", environ=env)
    # TensorFlow's own load of the tombstone fails, saying why, rather than read nothing.
    with pytest.raises(ValueError, match="was deleted"):
        list(tf.data.Dataset.load(path))
    status, again = service.delete(path)
    assert (status, again.state_before, again.removed) == (200, snapshots.DELETED, ()), again

    # A snapshot this dispatcher's journal does not name (a copy of one) goes entirely.
    copy = service.snapshot_dir / "copy"
    shutil.copytree(service.snapshot_dir / "running", copy)
    status, answer = service.deleted(str(copy))
    assert (status, answer.journaled, answer.state_before) == (200, False, snapshots.COMPLETED), answer
    assert not copy.exists() and service.state(str(copy)).state == snapshots.MISSING


def files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (links not followed) and its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_delete_of_another_services_snapshot_is_refused_and_deletes_nothing(service: Service) -> None:
    # Service A's completed snapshot in A's directory, beside this service's (B's) directory.
    theirs = service.snapshot_dir.parent / "service-a" / "train-v1"
    shutil.copytree(service.snapshot_dir / "running", theirs)
    before = files(theirs.parent)
    assert "DONE" in tree(theirs) and len(before) >= 4, before
    for path in (str(theirs), f"{service.snapshot_dir}/../service-a/train-v1", str(service.snapshot_dir)):
        status, body = service.ask("DELETE", path)
        assert status == 403, (path, status, body)
        assert f"serves only {service.snapshot_dir}/<name>" in body.decode(), body
    assert files(theirs.parent) == before, "not one file went"
    # Asked for its progress, it is refused as well: only this service's directory (and journal) is read.
    status, body = service.ask("GET", str(theirs))
    assert status == 403 and b"one name directly in" in body, body


def test_a_delete_through_a_planted_chunks_link_is_refused_and_the_journal_stays(service: Service) -> None:
    # What a trainer with the snapshot volume can plant: a finished "snapshot" whose chunks are the journal.
    journal = Path(service.dispatcher.config.work_dir or "") / "tf_data_dispatcher_journal"
    planted = service.snapshot_dir / "planted"
    planted.mkdir()
    (planted / "snapshot.metadata").write_bytes((service.snapshot_dir / "running" / "snapshot.metadata").read_bytes())
    (planted / "DONE").write_bytes(b"")
    (planted / "chunks").symlink_to(journal)
    journal_before, planted_before = files(journal), tree(planted)
    assert any(name.startswith("journal_") for name in journal_before), journal_before

    status, refused = service.delete(str(planted))
    assert (status, refused.removed) == (409, ()), refused
    assert f"{planted}/chunks is a symbolic link" in refused.detail and "nothing was deleted" in refused.detail
    assert files(journal) == journal_before and tree(planted) == planted_before, "nothing is touched"
    reading = service.state(str(planted))
    assert reading.state == snapshots.UNKNOWN and "a symbolic link was found" in (reading.detail or ""), reading
    service.dispatcher.wait_probe("/readyz", 200)  # the dispatcher still serves


def test_a_journal_planted_with_a_snapshots_files_in_the_directory_is_refused_and_stays(service: Service) -> None:
    # A dispatcher's workDir inside the snapshot directory (its journal and owner marker), with what a
    # trainer who can write there plants beside them: a finished snapshot's files.
    work = service.snapshot_dir / "work"
    shutil.copytree(
        Path(service.dispatcher.config.work_dir or "") / "tf_data_dispatcher_journal",
        work / "tf_data_dispatcher_journal",
    )
    (work / serverconfig.OWNER_MARKER_NAME).write_text("ml/other\n")
    (work / "snapshot.metadata").write_bytes((service.snapshot_dir / "running" / "snapshot.metadata").read_bytes())
    (work / "DONE").write_bytes(b"")
    before = files(work)

    status, refused = service.delete(str(work))
    assert (status, refused.removed, refused.under_way) == (409, (), False), refused
    assert "no tf.data snapshot writes there: tf_data_dispatcher_journal, tfdata-owner" in refused.detail, refused
    assert files(work) == before, "nothing is touched, no tombstone written"


SECRET = "TFDATA_TOKEN=kept-from-trainers-4f1c"


def test_an_error_link_to_a_secret_file_is_never_read(service: Service) -> None:
    secret = service.snapshot_dir.parent / "secret-env"
    secret.write_text(SECRET + "\n")
    leak = service.snapshot_dir / "leak"
    leak.mkdir()
    (leak / "snapshot.metadata").write_bytes((service.snapshot_dir / "running" / "snapshot.metadata").read_bytes())
    (leak / "ERROR").symlink_to(secret)

    status, body = service.ask("GET", str(leak))
    assert status == 200 and SECRET.encode() not in body, body
    (reading,) = snapshots.SnapshotsReport.from_json(body).snapshots
    assert (reading.state, reading.error) == (snapshots.UNKNOWN, None), reading
    assert f"a symbolic link was found: {leak}/ERROR" in (reading.detail or ""), reading
    status, body = service.ask("DELETE", str(leak))
    assert status == 409 and SECRET.encode() not in body and f"{leak}/ERROR is a symbolic link".encode() in body
    assert secret.read_text() == SECRET + "\n" and (leak / "ERROR").is_symlink()


def test_a_restarted_dispatcher_forgets_finished_snapshots_and_writes_one_saved_after_it(
    service: Service,
) -> None:
    """TensorFlow would restore every journaled snapshot among those it hands the workers, a finished
    one for good, and hand it out on every heartbeat when it sorts first (hash order): a snapshot
    saved after the restart then never got a stream. With four finished snapshots in the journal,
    the new one sorted first one time in five; now the finished ones leave the journal before the
    start, and a journaled path removed by hand no longer keeps the dispatcher from starting."""
    env = service.environ
    for name in ("finished-0", "finished-1"):
        client_snapshots.save(dataset(10, 0), name, "del", environ=env)
        client_snapshots.wait(name, "del", timeout=WAIT_TIMEOUT, poll_seconds=0.3, environ=env)
    kept, removed = str(service.snapshot_dir / "kept"), str(service.snapshot_dir / "finished-1")
    assert service.state(kept).state == snapshots.DELETED
    journaled = {s.path for s in client_snapshots.read_report(service.url("").partition("?")[0]).snapshots}
    assert journaled == {kept, removed, *(str(service.snapshot_dir / n) for n in ("running", "finished-0"))}
    shutil.rmtree(removed)  # by hand: TensorFlow's start would fail on it ("the snapshot path doesn't exist")

    dispatcher = service.restart_dispatcher()
    dispatcher.wait_probe("/readyz", 200)
    listed = {s.path: s.state for s in client_snapshots.read_report(service.url("").partition("?")[0]).snapshots}
    assert listed == {}, listed
    assert (service.state(kept).state, service.state(str(service.snapshot_dir / "running")).state) == (
        snapshots.DELETED,
        snapshots.COMPLETED,
    )
    assert f"the journal no longer names the snapshot at {removed} (its path is gone)" in dispatcher.log()
    # A new job reads through the restarted dispatcher (the worker registers with it again).
    address = f"grpc://127.0.0.1:{dispatcher.config.port}"
    read = tf.data.Dataset.range(20).apply(tf.data.experimental.service.distribute("parallel_epochs", address))
    assert sorted(int(x) for x in read.as_numpy_iterator()) == list(range(20))

    # A snapshot saved after the restart is written to the end.
    client_snapshots.save(dataset(20, 0), "after-restart", "del", environ=env)
    done = client_snapshots.wait("after-restart", "del", timeout=WAIT_TIMEOUT, poll_seconds=0.3, environ=env)
    assert (done.state, done.elements, done.journaled) == (snapshots.COMPLETED, 20, True), (
        done,
        dispatcher.log()[-3000:],
    )
